"""Orchestration overhead: `fleet run` against the trainer alone, on the same config, in one run.

Both sides are timed from the command's start to the same two events: the trainer's FINISHED line (the
result is written) and every process the command started gone (bench/overhead_watch.py: the trainer's
own lines in its Ray worker's log, and a child subreaper). The trainer alone is `python -m trainer train`
on the job's TrainJob, in the node's Python (.venv-node) as the local node runs it (Ray Train with its own
local cluster). `fleet run` adds the rest: an embedded Redis, a Celery worker, a local Ray head with token
auth in its sandbox, the readiness check, the prepare (fetch) job, event relaying, the pull of the results
and the teardown.

Each round runs four commands, in this order so that drift hits both sides:
- cold: a fresh home for each side (no embedded Redis up, no worker, no readiness check remembered, an
  empty model cache: the tiny model is built on both sides), as a first `fleet run` on a new machine;
- warm: one home kept for all warm runs (warmed by one untimed run first), as every later `fleet run`.
The headline is the cold ratio to "every process gone", the time a user waits for it all.

    .venv/bin/python bench/overhead.py [--repeats 3] [--config configs/examples/tiny-lora.yml]

Left out: the operating system's page cache is warm on both sides after the first round (a truly first
run also reads Python, torch and Ray from disk), and a rented node's boot and image pull (bench/provision.py).
The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Run as a script, this folder would come first on sys.path (and `import trainer` find bench/trainer.py).
sys.path[:] = [
    str(REPO),
    *(p for p in sys.path if Path(p or ".").resolve() not in (REPO, Path(__file__).resolve().parent)),
]

import providers.registry  # noqa: E402, F401  (declares the clouds to jobs/ and core/, as the fleet's entries do)
from bench.overhead_watch import Lines, become_subreaper, run_until_gone  # noqa: E402
from jobs.spec import load_job  # noqa: E402
from service.embedded import stop_redis  # noqa: E402
from trainer.config import TrainJob  # noqa: E402

# The trainer alone runs in the Python the local node runs it in (make setup's node environment).
NODE_PYTHON = (
    REPO / ".venv-node/bin/python" if (REPO / ".venv-node/bin/python").exists() else Path(sys.executable)
)
GOALS = {"cold": 1.3, "warm": 1.1}  # issue 40: a ratio to "every process gone"
# The fleet's phases, each from one event to the next (None: the command's start; a line: the trainer's).
FLEET_PHASES = (
    ("cli", None, "run.queued"),
    ("worker_start", "run.queued", "stage.started:provision"),
    ("provision", "stage.started:provision", "instance.ready"),
    ("readiness", "instance.ready", "node.ready"),
    ("fetch", "node.ready", "stage.started:train"),
    ("ray_job_start", "stage.started:train", "line:started"),
    ("training", "line:started", "line:finished"),
    ("teardown", "line:finished", "gone"),
)
ALONE_PHASES = (
    ("ray_job_start", None, "line:started"),
    ("training", "line:started", "line:finished"),
    ("teardown", "line:finished", "gone"),
)


@dataclass
class Side:
    """One command's figures, seconds from its start."""

    finished_s: float
    gone_s: float
    exit_s: float
    phases: dict[str, float]
    lingering: list[str]


def clean_env(home: Path, settings: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "RAY_")) and k != "REDIS_URL"}
    env.update(FLEET_HOME=str(home), FLEET_SETTINGS_FILE=str(settings), PYTHONUNBUFFERED="1")
    return env


def phases_of(marks: dict[str, float], table: tuple[tuple[str, str | None, str], ...]) -> dict[str, float]:
    """Each phase's length from the marks (seconds from the start); one with a mark missing is left out."""
    marks = {**marks, "start": 0.0}
    out = {}
    for name, begin, end in table:
        a, b = marks.get(begin or "start"), marks.get(end)
        if a is not None and b is not None:
            out[name] = round(b - a, 2)
    return out


def fleet_marks(env: dict[str, str], out: Path, t0_wall: float) -> dict[str, float]:
    """The first time of each event of the run `fleet run --json` printed (its last JSON object)."""
    text = out.read_text()
    run_id = json.loads(text[text.rindex("\n{") :] if "\n{" in text else text)["run_id"]
    argv = [sys.executable, "-m", "fleet", "logs", run_id, "--json"]
    logs = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, check=True)
    marks: dict[str, float] = {}
    for line in logs.stdout.splitlines():
        event = json.loads(line)
        key = event["type"] + (f":{event['data']['stage']}" if event["type"].startswith("stage.") else "")
        marks.setdefault(key, event["time"] - t0_wall)
    return marks


def measure(argv: list[str], env: dict[str, str], owner: str, log: Path, fleet: bool) -> Side:
    """Run one side and read its marks; `owner` is a path its FINISHED line's output_dir contains."""
    roots = ["/tmp/tfray-*"] if fleet else [env["RAY_TMPDIR"] + "/ray"]  # Ray adds /ray to RAY_TMPDIR
    lines = Lines(roots=roots, since=time.time())
    lines.start()
    t0_wall, t0 = time.time(), time.perf_counter()
    try:
        timed = run_until_gone(argv, env, REPO, log, t0)
    finally:
        lines.stop()
    marks = fleet_marks(env, log, t0_wall) if fleet else {}
    for kind in ("started", "finished"):
        at = lines.stamp(kind, owner)
        if at is None:
            raise SystemExit(f"no {kind.upper()} line of {owner} seen in the Ray worker logs; see {log}")
        marks[f"line:{kind}"] = at - t0
    marks["gone"] = timed.gone_s
    return Side(
        finished_s=round(marks["line:finished"], 2),
        gone_s=round(timed.gone_s, 2),
        exit_s=round(timed.exit_s, 2),
        phases=phases_of(marks, FLEET_PHASES if fleet else ALONE_PHASES),
        lingering=timed.lingering,
    )


class Bench:
    def __init__(self, config: Path, work: Path) -> None:
        self.config, self.work = config, work
        self.settings = work / "none.yml"
        self.settings.write_text("{}\n")
        self.spec = load_job(config).spec
        self.count = 0

    def fleet(self, home: Path) -> Side:
        self.count += 1
        argv = [sys.executable, "-m", "fleet", "run", str(self.config), "--json"]
        log = self.work / f"fleet-{self.count}.json"
        return measure(argv, clean_env(home, self.settings), str(home), log, fleet=True)

    def alone(self, home: Path) -> Side:
        self.count += 1
        run_dir = self.work / f"alone-{self.count}"
        job = TrainJob(
            run_id=run_dir.name,
            config=self.spec.train,
            work_dir=str(run_dir),
            output_dir=str(run_dir / self.spec.train.output_dir),
            cache_dir=str(home / "cache"),
            use_gpu=self.spec.gpu_count > 0,
        )
        job_file = self.work / f"job-{self.count}.json"
        job_file.write_text(job.to_env())
        env = clean_env(home, self.settings)
        env["RAY_TMPDIR"] = str(self.work / f"r{self.count}")  # short: Ray's socket paths are bounded
        argv = [str(NODE_PYTHON), "-m", "trainer", "train", "--job", str(job_file)]
        return measure(argv, env, str(run_dir), self.work / f"alone-{self.count}.log", fleet=False)


def summary(pairs: list[tuple[Side, Side]]) -> dict[str, object]:
    to_gone = [f.gone_s / a.gone_s for f, a in pairs]
    to_finished = [f.finished_s / a.finished_s for f, a in pairs]
    return {
        "ratio_gone_median": round(statistics.median(to_gone), 3),
        "ratio_finished_median": round(statistics.median(to_finished), 3),
        "ratio_gone_each": [round(r, 3) for r in to_gone],
        "fleet": [asdict(f) for f, _ in pairs],
        "alone": [asdict(a) for _, a in pairs],
    }


def show(label: str, i: int, fleet: Side, alone: Side) -> None:
    print(
        f"  {label} {i}: fleet run finished {fleet.finished_s:.1f} s, all gone {fleet.gone_s:.1f} s | "
        f"trainer alone finished {alone.finished_s:.1f} s, all gone {alone.gone_s:.1f} s",
        flush=True,
    )
    print(f"    fleet phases: {fleet.phases}", flush=True)
    print(f"    alone phases: {alone.phases}", flush=True)
    for side in (fleet, alone):
        if side.lingering:
            print(f"    still there after 120 s: {side.lingering}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs/examples/tiny-lora.yml")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    become_subreaper()
    bench = Bench(args.config.resolve(), Path(tempfile.mkdtemp(prefix="tfb-")))
    warm_home = bench.work / "warm"
    homes = [warm_home]
    cold: list[tuple[Side, Side]] = []
    warm: list[tuple[Side, Side]] = []
    try:
        print("warm-up: one untimed fleet run in the warm home", flush=True)
        bench.fleet(warm_home)
        for i in range(1, args.repeats + 1):
            fleet_home, alone_home = bench.work / f"cold-fleet-{i}", bench.work / f"cold-alone-{i}"
            homes.append(fleet_home)
            cold.append((bench.fleet(fleet_home), bench.alone(alone_home)))
            stop_redis(fleet_home)
            show("cold", i, *cold[-1])
            warm.append((bench.fleet(warm_home), bench.alone(warm_home)))
            show("warm", i, *warm[-1])
    finally:
        for home in homes:
            stop_redis(home)
    result = {
        "config": str(args.config.relative_to(REPO) if args.config.is_relative_to(REPO) else args.config),
        "repeats": args.repeats,
        "headline": "cold ratio, fleet run / trainer alone, start to every process gone (median)",
        "cold": summary(cold),
        "warm": summary(warm),
        "goals": GOALS,
        "cpus": os.cpu_count(),
        "logs": str(bench.work),
    }
    for label in ("cold", "warm"):
        figures = result[label]
        assert isinstance(figures, dict)
        print(
            f"{label}: fleet run / trainer alone, median of {args.repeats}: {figures['ratio_gone_median']} "
            f"to all gone, {figures['ratio_finished_median']} to FINISHED (goal <= {GOALS[label]})"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
