"""What an idle node costs a user before the reaper ends it, with the fleet's default settings: the seconds
billed after the node went idle, and their price at $2/h.

A running fleet (`fleet up`: a real Celery worker and beat) with every FLEET_* setting at its default (the
reaper every 30 s, the orphan grace of 120 s, ...) watches the fake RunPod. Only where things are is set:
the fleet's home, an empty settings file, RunPod's key, the fake's URL and its HTTPS proxy in place of
RunPod's (FLEET_RUNPOD_PROXY_URL, FLEET_RUNPOD_PROXY_CA_FILE): their names are printed and in the JSON's
`where`. Pods are left idle as a finished `one_shot: false` run leaves its node (the run SUCCEEDED, its pod
still up), with the job's `stop_after` (its default, 900 s, unless `--stop-after` says otherwise: a job's
choice, not a fleet setting; 60 is the shortest a job may ask for). Their runs end at staggered moments,
so the samples fall at different phases of the reaper's clock. Each pod's ledger record says it was rented
`--trained` seconds before its run ended (default 600: the node of a ten-minute run); the pod itself is
new at the fake. For each pod:

- billed idle: from the run's end to the moment the provider stops listing the pod (sampled every 0.1 s):
  what a user pays for a node that does nothing, stop_after included;
- late: how long after its stop_after deadline that was (the promise: under 60 s);
- dollars: the billed idle time priced at $2/h (a typical A100 spot price; the fake's own price is lower).

Left out: a provider's billing increment (the seconds are not rounded up to any) and the time a real
provider takes to stop a pod once asked (the fake stops listing it at once). A node whose run ended when
it was younger than FLEET_ORPHAN_GRACE_S (120 s) is not judged before that age, then at the next periodic
pass: with `--trained` under 120 - stop_after it costs more than by default here (`--trained 0` shows it).

    .venv/bin/python bench/reap.py [--pods 4] [--stagger 11] [--stop-after 900] [--trained 600]
                                   [--reap-interval S]   (a changed setting: printed, and in the JSON)

The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from pydantic import SecretStr

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import providers.registry  # noqa: E402, F401  (declares the clouds to jobs/ and core/, as the fleet's entries do)
from broker.queues import REAP_QUEUE  # noqa: E402
from core.settings import Settings  # noqa: E402
from providers.base import LaunchRequest, ProviderContext  # noqa: E402
from providers.runpod.provider import RunPodProvider  # noqa: E402
from providers.runpod.section import RunPodSection  # noqa: E402
from service.embedded import ensure_redis, stop_redis  # noqa: E402
from state.ledger import Ledger  # noqa: E402
from state.models import Instance, InstanceState  # noqa: E402
from state.stages import RunState  # noqa: E402
from tests.factories import ledger_run  # noqa: E402
from tests.fakes.runpod import FakeRunPod  # noqa: E402
from workers.process import served_queues  # noqa: E402

KEY = "bench-key"
RATE = 2.0  # $/h
JOB_STOP_AFTER = int(RunPodSection.model_fields["stop_after"].default)


def idle_pod(
    ledger: Ledger, provider: RunPodProvider, name: str, section: RunPodSection, trained: float
) -> None:
    """A pod left up by a run that just SUCCEEDED with one_shot: false, rented `trained` seconds before."""
    pod = provider.launch(LaunchRequest(name, name, section))
    ledger.put_instance(
        Instance(
            name=name,
            provider="runpod",
            run_id=name,
            state=InstanceState.RUNNING,
            provider_id=pod.provider_id,
            created_at=time.time() - trained,
        )
    )
    ledger.create_run(ledger_run(name, section, RunState.SUCCEEDED, instance=name), [])


def where(home: Path, fake: FakeRunPod) -> dict[str, str]:
    """The settings that say where things are (the fleet's home, files, the fake RunPod and its proxy)."""
    return {
        "FLEET_HOME": str(home), "FLEET_SETTINGS_FILE": str(home / "none.yml"),
        "FLEET_SECRETS_FILE": str(home / "no-secrets.yml"), "RUNPOD_API_KEY": KEY,
        "RUNPOD_API_BASE_URL": fake.url, **fake.proxy.settings(),
    }  # fmt: skip


def fleet_env(located: dict[str, str], changed: dict[str, str]) -> dict[str, str]:
    """The fleet's environment: no FLEET_* or RAY_* from outside, only where things are, plus `changed`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "RAY_")) and k != "REDIS_URL"}
    return {**env, **located, "PYTHONUNBUFFERED": "1", **changed}


def wait_for_reap_worker(client: redis.Redis[str], worker: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Until a worker serves the reap queue (its heartbeat in Redis); stop when `fleet up` exits."""
    deadline = time.monotonic() + timeout_s
    while REAP_QUEUE not in served_queues(client):
        if worker.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"`fleet up` did not serve the {REAP_QUEUE} queue (exit {worker.returncode})")
        time.sleep(0.2)


def watch(
    args: argparse.Namespace, stop_after: int, changed: dict[str, str]
) -> tuple[dict[str, float], dict[str, float], list[str]]:
    """Run the fleet, leave the pods idle, and note when each run ended and when its pod went; and the
    names of the settings that said where things are."""
    section = RunPodSection(gpu="NVIDIA RTX A5000", one_shot=False, stop_after=stop_after)
    interval = float(changed.get("FLEET_REAP_INTERVAL_S", Settings.model_fields["reap_interval_s"].default))
    ended: dict[str, float] = {}
    gone: dict[str, float] = {}
    with (
        tempfile.TemporaryDirectory(prefix="bench-reap-") as tmp,
        FakeRunPod(api_key=KEY, nodes="none") as fake,
    ):
        home = Path(tmp) / "fleet"
        home.mkdir()
        (home / "none.yml").write_text("{}\n")
        client: redis.Redis[str] = redis.Redis.from_url(ensure_redis(home), decode_responses=True)
        ledger = Ledger(client)
        context = ProviderContext(
            home, urls={"runpod": fake.url}, credentials={"RUNPOD_API_KEY": SecretStr(KEY)}
        )
        provider = RunPodProvider(context)
        located = where(home, fake)
        print(f"where things are: {sorted(located)}", flush=True)
        log = (home / "worker.log").open("ab")
        worker = subprocess.Popen(
            [sys.executable, "-m", "fleet", "up"], env=fleet_env(located, changed), cwd=REPO,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            wait_for_reap_worker(client, worker, 120)
            for i in range(args.pods):
                name = f"tf-idle{i}-1"
                idle_pod(ledger, provider, name, section, args.trained)
                ended[name] = ledger.get_run(name).updated_at
                time.sleep(args.stagger)  # pacing the samples, not waiting for an outcome
            deadline = time.time() + stop_after + 4 * interval + 60
            while len(gone) < len(ended) and time.time() < deadline:
                listed = {str(i["name"]) for i in fake.state()["instances"]}
                gone.update({name: time.time() for name in ended if name not in listed and name not in gone})
                time.sleep(0.1)  # the sampling period
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(30)
            log.close()
            client.close()
            stop_redis(home)
            if len(gone) < len(ended):  # say why, before the directory goes
                print((home / "worker.log").read_text()[-3000:], file=sys.stderr)
    return ended, gone, sorted(located)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--stagger", type=float, default=11.0, help="seconds between two runs' ends")
    parser.add_argument("--stop-after", type=int, default=None, help=f"the job's (default {JOB_STOP_AFTER})")
    parser.add_argument("--trained", type=float, default=600.0, help="seconds each pod was up before idling")
    parser.add_argument("--reap-interval", type=float, default=None, help="changes FLEET_REAP_INTERVAL_S")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: still end the fleet and Redis
    stop_after = JOB_STOP_AFTER if args.stop_after is None else args.stop_after
    changed = {} if args.reap_interval is None else {"FLEET_REAP_INTERVAL_S": f"{args.reap_interval:g}"}
    settings = (
        f"changed: {changed} (asked for on the command line)"
        if changed
        else "every FLEET_* setting at its default"
    )
    job = "the job's default" if args.stop_after is None else "the job's choice (--stop-after)"
    print(f"{args.pods} idle pods; {settings}; stop_after {stop_after} s, {job}", flush=True)

    ended, gone, located = watch(args, stop_after, changed)
    samples: list[dict[str, Any]] = []
    for name, end in ended.items():
        idle = gone.get(name, float("nan")) - end
        samples.append(
            {
                "pod": name,
                "billed_idle_s": round(idle, 1),
                "late_s": round(idle - stop_after, 1),
                "usd": round(idle * RATE / 3600, 4),
            }
        )
        print(
            f"{name}: billed {idle:6.1f} s after its run ended, {idle - stop_after:5.1f} s past stop_after, "
            f"${idle * RATE / 3600:.4f} at ${RATE:.0f}/h"
        )
    billed = [s["billed_idle_s"] for s in samples]
    lates = [s["late_s"] for s in samples]
    summary = {
        "pods": len(samples),
        "reaped": len(gone),
        "changed_settings": changed,
        "where": located,
        "changed_why": "asked for with --reap-interval" if changed else None,
        "stop_after_s": stop_after,
        "stop_after_is_job_default": args.stop_after is None,
        "trained_s": args.trained,
        "billed_idle_s_mean": round(statistics.fmean(billed), 1),
        "billed_idle_s_max": max(billed),
        "late_s_mean": round(statistics.fmean(lates), 1),
        "late_s_max": max(lates),
        "idle_usd_at_2_per_h_mean": round(statistics.fmean(s["usd"] for s in samples), 4),
        "idle_usd_at_2_per_h_max": max(s["usd"] for s in samples),
        "within_stop_after_plus_60": len(gone) == len(ended) and max(lates) <= 60,
        "leaves_out": "billing increments, a real provider's time to stop a pod once asked",
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
