"""The control plane under load: N runs at once through the real fleet, against fake clouds whose nodes
replay a recorded trainer (issue 21's bench; the "before" and "after" of its redesign).

N runs of the tiny job (configs/examples/tiny-lora.yml with a `runpod:` section, a `--vast-fraction` of
them with a `vastai:` one) are validated with `jobs.spec.load_job` and submitted at once with
`service.runs.submit` into the embedded Redis, served by real Celery workers (`fleet worker` per stage
queue as docker-compose.yml runs them, plus `fleet beat`; or one `fleet up`: `--layout up`) and posted by
`fleet notify` into a fake Discord. The fake RunPod and vast.ai (bench/scale_fake.py, one process each)
rent replay nodes (tests.fakes.replay): each answers the Ray Jobs API and completes every job of a run
without Ray or torch, its train job replaying a recorded progress stream over `--train-seconds`. So the
control plane, not training, is what is measured. Every fleet setting keeps its default (poll interval,
reaper, leases); the fakes' nodes take `--boot-seconds` to come up.

Measured (each figure's `how` says more):
- runs submitted, their end states, wall seconds from the first submit to the last run's end (ledger);
- provider API calls per fake (its request counters, `GET /_fake/state`, sampled every 0.5 s): total,
  per run, mean and peak per second (over any 1 s window), per operation (list, get, create, terminate...);
- Celery tasks per run (the workers' `received` log lines, per task) and Celery messages published (the
  LPUSH/RPUSH delta in Redis's INFO commandstats); Redis commands per run (INFO total_commands_processed
  delta, less the bench's own);
- node event -> ledger: from the moment a replayed progress line appeared in its node's log (the line
  carries it: `replay_emitted_at`) to its event's stream entry in Redis; node event -> Discord: to the
  first post of the run's status message after that (created or edited, by the fake Discord's clock);
- stage transitions: from a node job's end (the replay nodes' journal) to the ledger event that acts on
  it (the next stage's start, or run.succeeded), and from run.queued to the provision stage's start;
- peak RSS of the workers (all their processes, psutil), leaked instances (live on a fake once every run
  ended) and duplicates (instance names ever live twice at once, the fakes' `most_live`): both must be 0;
- CPU seconds by kind of process: the fakes, their nodes and the fake Discord (in this process) share the
  machine's cores with the fleet, so a busy fake slows the fleet down too.

    .venv/bin/python bench/scale.py [--runs 200] [--workers 2] [--train-seconds 4] [--timeout 1800]

The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# Run as a script, this file's folder would come first on sys.path; the siblings are `bench.<name>`.
sys.path[:] = [
    str(REPO),
    *(p for p in sys.path if Path(p or ".").resolve() not in (REPO, Path(__file__).resolve().parent)),
]

import redis  # noqa: E402

import providers.registry  # noqa: E402, F401  (declares the clouds to jobs/ and core/, as the fleet's entries do)
from bench import scale_figures as figures  # noqa: E402
from bench import scale_procs as procs  # noqa: E402
from bench.scale_sample import Sampler  # noqa: E402
from bench.scale_sample import fake_state as figures_state  # noqa: E402
from service.embedded import stop_redis  # noqa: E402
from state.keys import EVENTS_STREAM, NOTIFIER_GROUP, run_events_key, run_key  # noqa: E402
from tests.factories import EXAMPLE_YAML, copy_example_data  # noqa: E402
from tests.fakes import FakeDiscord  # noqa: E402
from tests.fakes.replay import JOURNAL  # noqa: E402

KEYS = {"runpod": "bench-runpod-key-0123456789", "vastai": "bench-vast-key-9876543210"}
SECTIONS = {
    "runpod": "runpod:\n  gpu: NVIDIA RTX A5000\n  max_bid_per_gpu: 0.5\n  one_shot: true\n",
    "vastai": "vastai:\n  gpu: RTX A5000\n  cloud_type: ALL\n  max_bid_per_gpu: 0.5\n  one_shot: true\n",
}
DISCORD_TOKEN = "bench-bot-token"
CHANNEL = 523456789012345678
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="runs submitted at once")
    parser.add_argument("--vast-fraction", type=float, default=0.5, help="share of the runs on vast.ai")
    parser.add_argument("--workers", type=int, default=2, help="processes of each stage worker (-c)")
    parser.add_argument("--layout", choices=procs.LAYOUTS, default="compose", help="how workers run")
    parser.add_argument("--train-seconds", type=float, default=4.0, help="a replayed train job's length")
    parser.add_argument("--boot-seconds", type=float, default=3.0, help="a fake node's time to come up")
    parser.add_argument("--timeout", type=float, default=1800, help="give up waiting after this (s)")
    parser.add_argument("--no-notifier", action="store_true", help="run without `fleet notify`")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (logs, homes)")
    return parser.parse_args()


def fleet_env(work: Path, fakes: dict[str, procs.Proc], discord_url: str | None) -> dict[str, str]:
    """The fleet's environment: its home under `work`, the fakes' URLs and keys; no setting changed."""
    from tests.fakes.runpod import proxy_settings

    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "RAY_")) and k != "REDIS_URL"}
    (work / "none.yml").write_text("{}\n")
    env.update(FLEET_HOME=str(work / "home"), FLEET_SETTINGS_FILE=str(work / "none.yml"))
    env.update(FLEET_SECRETS_FILE=str(work / "no-secrets.yml"), PYTHONUNBUFFERED="1")
    env.update(RUNPOD_API_BASE_URL=str(fakes["runpod"].url), RUNPOD_API_KEY=KEYS["runpod"])
    env.update(VAST_URL=str(fakes["vastai"].url), VAST_API_KEY=KEYS["vastai"])
    env.update(proxy_settings(str(fakes["runpod"].url)))  # the pods' HTTPS proxy, and its certificate
    if discord_url is not None:
        env.update(FLEET_DISCORD_BOT_TOKEN=DISCORD_TOKEN, FLEET_DISCORD_CHANNEL_ID=str(CHANNEL))
        env.update(FLEET_DISCORD_API_BASE=f"{discord_url}/api/v10")
    return env


def job_files(work: Path) -> dict[str, Path]:
    """The tiny job with each provider's section (one Ray worker per GPU: ray_num_workers dropped)."""
    folder = work / "jobs"
    folder.mkdir()
    copy_example_data(folder)
    text = EXAMPLE_YAML.read_text().replace("ray_num_workers: 2\n", "")
    files = {}
    for provider, section in SECTIONS.items():
        files[provider] = folder / f"{provider}.yml"
        files[provider].write_text(text.replace("local:\n  one_shot: true\n", section))
    return files


def submit_all(args: argparse.Namespace, files: dict[str, Path]) -> dict[str, Any]:
    """Validate each job file once, then submit `--runs` runs as fast as one process can (the real
    service.runs.submit). Run ids are service.runs.new_run_id's, drawn again on a repeat (see `repeats`)."""
    from jobs.spec import load_job
    from providers.world import World
    from service.runs import Fleet, new_run_id, submit

    settings = World.load().settings
    fleet = Fleet.connect(World.of(settings))
    jobs = {p: load_job(f, default_provider=settings.default_provider) for p, f in files.items()}
    ids: list[str] = []
    providers: dict[str, str] = {}
    repeats = 0
    started = time.time()
    for i in range(args.runs):  # the vast.ai runs spread evenly among the RunPod ones
        vast = int((i + 1) * args.vast_fraction) > int(i * args.vast_fraction)
        provider = "vastai" if vast else "runpod"
        run_id = new_run_id()
        while run_id in ids:  # the same second's 4 hex digits drawn twice: the ledger would overwrite
            repeats, run_id = repeats + 1, new_run_id()
        ids.append(submit(fleet, jobs[provider], run_id=run_id).run_id)
        providers[run_id] = provider
    ended = time.time()
    fleet.redis.close()
    took = round(ended - started, 2)
    return {"ids": ids, "providers": providers, "started": started, "submit_s": took, "id_repeats": repeats}


def wait_for_runs(
    client: redis.Redis[str], sampler: Sampler, ids: list[str], timeout_s: float
) -> dict[str, str]:
    """Each run's state once all are terminal, or when `timeout_s` has passed (then some are not)."""
    deadline, said = time.monotonic() + timeout_s, 0.0
    while True:
        raws = client.mget([run_key(i) for i in ids])
        sampler.count("mget")
        states = {i: json.loads(raw)["state"] if raw else "MISSING" for i, raw in zip(ids, raws, strict=True)}
        done = sum(s in TERMINAL for s in states.values())
        if done == len(ids) or time.monotonic() > deadline:
            return states
        if time.monotonic() - said > 15:
            said = time.monotonic()
            counts = {s: list(states.values()).count(s) for s in sorted(set(states.values()))}
            last = sampler.samples[-1]
            print(f"  {done}/{len(ids)} ended; states {counts}; queued {last.queued}", flush=True)
        time.sleep(2.0)  # the figures take the runs' ends from the ledger, not from this loop


def info(client: redis.Redis[str], sampler: Sampler) -> dict[str, Any]:
    snapshot = {**client.info("stats"), **client.info("commandstats")}
    sampler.count("info", 2)
    return snapshot


def notifier_caught_up(client: redis.Redis[str]) -> bool:
    groups = [g for g in client.xinfo_groups(EVENTS_STREAM) if g["name"] == NOTIFIER_GROUP]
    last = client.xrevrange(EVENTS_STREAM, count=1)
    return bool(
        groups and last and groups[0]["pending"] == 0 and groups[0]["last-delivered-id"] == last[0][0]
    )


def wait_until(check: Any, timeout_s: float, every: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


def gather(
    client: redis.Redis[str], ids: list[str], work: Path, vendors: list[str]
) -> tuple[dict[str, figures.Stream], list[dict[str, Any]]]:
    """Every run's events (stream entry id, event) and the replay nodes' journals."""
    streams = {}
    for run_id in ids:
        entries = client.xrange(run_events_key(run_id))
        streams[run_id] = [(sid, json.loads(fields["event"])) for sid, fields in entries]
    journal = []
    for vendor in vendors:
        path = work / f"fake-{vendor}" / JOURNAL
        if path.exists():
            journal += [json.loads(line) for line in path.read_text().splitlines() if line]
    return streams, journal


def compute(ctx: dict[str, Any]) -> dict[str, Any]:
    """The figures (see the module docstring), from what `measure` gathered."""
    samples, streams, ids = ctx["samples"], ctx["streams"], ctx["submitted"]["ids"]
    states = ctx["states"]
    ended = figures.end_of_runs(streams) or samples[-1].at
    wall = ended - ctx["submitted"]["started"]
    counts = {s: list(states.values()).count(s) for s in sorted(set(states.values()))}
    most_live = {v: state["most_live"] for v, state in ctx["fake_states"].items()}
    result: dict[str, Any] = {
        "runs": len(ids),
        "vast_runs": list(ctx["submitted"]["providers"].values()).count("vastai"),
        "succeeded": counts.get("SUCCEEDED", 0),
        "states": counts,
        "timed_out": any(s not in TERMINAL for s in states.values()),
        "wall_s": round(wall, 1),
        "submit_s": ctx["submitted"]["submit_s"],
        "settings": ctx["settings"],
        "provider_api": {
            v: figures.api_calls(samples, v, len(ids), wall, ctx["fake_states"][v]["listed_at"])
            for v in ctx["vendors"]
        },
        "celery_tasks": figures.celery_tasks(ctx["logs"], len(ids)),
        "redis_commands": figures.redis_commands(ctx["before"], ctx["after"], ctx["own"], len(ids)),
        "node_to_ledger_s": figures.spread(figures.node_to_ledger(streams)),
        "node_to_discord_s": (
            figures.node_to_discord(streams, ctx["discord"]) if ctx["discord"] is not None else None
        ),
        "discord_requests": ctx["discord"]["requests"] if ctx["discord"] is not None else None,
        "stage_transition_s": figures.transitions(streams, ctx["journal"]),
        "run": figures.run_figures(streams),
        "cpu_s": {
            **ctx["cpu_s"],
            "share_of_all_cores": round(sum(ctx["cpu_s"].values()) / (wall * (os.cpu_count() or 1)), 2),
            "how": "user+system CPU seconds, from the first submit until every run was seen ended",
        },
        "peak_rss_mb": {
            "workers_total": round(max(s.rss_total for s in samples) / 2**20, 1),
            "largest_process": round(max(s.rss_max for s in samples) / 2**20, 1),
            "processes": max(s.processes for s in samples),
        },
        "peak_backlog": {q: max(s.queued[q] for s in samples) for q in samples[0].queued},
        "peak_unacked": max(s.unacked for s in samples),
        "leaked": sum(samples[-1].live.values()),
        "duplicates": sum(1 for names in most_live.values() for n in names.values() if n > 1),
        "instances_created": {v: len(names) for v, names in most_live.items()},
        "id_repeats": ctx["submitted"]["id_repeats"],
        "sampler_gaps": ctx["sampler_errors"],
        "notifier_caught_up": ctx["caught_up"],
    }
    return result


def settings_shown(args: argparse.Namespace) -> dict[str, Any]:
    """What the bench sets, and the fleet's defaults that shape its polling (none of them changed)."""
    from providers.world import World

    fleet = World.load().settings
    defaults = (
        "poll_interval_s",
        "reap_interval_s",
        "stall_after_s",
        "node_ready_timeout_s",
        "worker_concurrency",
    )
    return {
        "fleet_changed": {"FLEET_WORKER_CONCURRENCY": args.workers} if args.layout == "up" else {},
        "fleet_defaults": {name: getattr(fleet, name) for name in defaults},
        "workers": {"layout": args.layout, "concurrency": args.workers},
        "fakes": {"boot_s": args.boot_seconds, "train_s": args.train_seconds, "vast_offers": args.runs + 8},
        "notifier": not args.no_notifier,
    }


def measure(
    args: argparse.Namespace, work: Path, started: list[procs.Proc], discord: FakeDiscord | None
) -> dict[str, Any]:
    """Start the fleet on the fakes, submit, wait, gather; the figures."""
    from service.embedded import ensure_redis
    from workers.process import missing_queues

    fakes = {
        v: procs.serve_fake(v, work / f"fake-{v}", KEYS[v], args.train_seconds, args.boot_seconds, args.runs)
        for v in KEYS
    }
    started += fakes.values()
    env = fleet_env(work, fakes, discord.url if discord is not None else None)
    os.environ.update(env)  # the bench's own service calls reach the same fleet
    client = redis.Redis.from_url(ensure_redis(work / "home"), decode_responses=True)
    workers = procs.start_workers(env, args.layout, args.workers, work / "logs")
    started += workers
    if discord is not None:
        started.append(procs.fleet_proc("notify", ["notify"], env, work / "logs"))
        started[-1].fleet = False  # its RSS is not the workers'
        if not wait_until(lambda: "get_me" in discord.state()["requests"], 60):
            raise SystemExit(f"the notifier did not log in; see {work / 'logs' / 'notify.log'}")
    if not wait_until(lambda: not missing_queues(client), 120):
        raise SystemExit(f"the workers did not come up; see {work / 'logs'}")
    sampler = Sampler(client, {v: str(p.url) for v, p in fakes.items()}, workers)
    socket = client.connection_pool.connection_kwargs.get("path", "")
    before = info(client, sampler)
    cpu_before = procs.cpu_seconds(started, socket)
    sampler.start()
    print(f"submitting {args.runs} runs", flush=True)
    submitted = submit_all(args, job_files(work))
    print(f"submitted in {submitted['submit_s']} s; waiting for every run to end", flush=True)
    states = wait_for_runs(client, sampler, submitted["ids"], args.timeout)
    cpu_after = procs.cpu_seconds(started, socket)
    sampler.stop()
    caught_up = discord is not None and wait_until(lambda: notifier_caught_up(client), 120)
    after = info(client, sampler)
    fake_states = {v: figures_state(str(p.url)) for v, p in fakes.items()}
    streams, journal = gather(client, submitted["ids"], work, list(fakes))
    return compute({
        "samples": sampler.samples, "streams": streams, "submitted": submitted,
        "states": states, "settings": settings_shown(args), "vendors": list(fakes), "logs": work / "logs",
        "before": before, "after": after, "own": sampler.own, "journal": journal,
        "discord": discord.state() if discord is not None else None, "fake_states": fake_states,
        "sampler_errors": sampler.errors, "caught_up": caught_up,
        "cpu_s": {k: round(cpu_after[k] - cpu_before[k], 1) for k in cpu_after},
    })  # fmt: skip


def show(result: dict[str, Any]) -> None:
    """The figures in a few lines, before the JSON."""
    say = print
    runs = f"{result['runs']} ({result['vast_runs']} on vast.ai)"
    say(f"runs {runs}: {result['states']} in {result['wall_s']} s")
    for vendor, calls in result["provider_api"].items():
        ops = ", ".join(
            f"{op} {row['total']} (peak {row['peak_per_s']}/s)" for op, row in calls["by_op"].items()
        )
        say(f"{vendor}: {calls['total']} calls, {calls['per_run']}/run, peak {calls['peak_per_s']}/s: {ops}")
    tasks, commands = result["celery_tasks"]["per_run"], result["redis_commands"]["per_run"]
    say(f"celery tasks/run {tasks}; redis commands/run {commands}")
    say(f"node -> ledger {result['node_to_ledger_s']}; node -> discord {result['node_to_discord_s']}")
    say(f"node job end -> next stage {result['stage_transition_s']['node_job_end_to_next']}")
    say(f"peak RSS {result['peak_rss_mb']}; leaked {result['leaked']}; duplicates {result['duplicates']}")
    say(f"CPU seconds {result['cpu_s']}")


def main() -> None:
    args = parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-bench-scale-"))
    started: list[procs.Proc] = []
    discord = None if args.no_notifier else FakeDiscord(token=DISCORD_TOKEN).start()
    try:
        result = measure(args, work, started, discord)
    finally:
        procs.stop(started)
        if discord is not None:
            discord.stop()
        stop_redis(work / "home")
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    result["work"] = str(work) if args.keep else None
    show(result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
