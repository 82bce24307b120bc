"""Record the progress stream that the fake clouds' replay nodes play back (tests.fakes.replay).

Runs the tiny job's trainer alone, as a node runs it (`python -m trainer fetch`, then `python -m trainer
train`, on the example's TrainJob: Ray Train with its own local cluster), and keeps every progress line
each prints, with the seconds since the job started at which it arrived. The run's directories and id are
written as `{work_dir}`, `{output_dir}`, `{cache_dir}` and `{run_id}`, which a replay node fills with its
run's own; other paths of this machine as a node's (`/node/...`). Writes tests/data/replay/
train-progress.jsonl and fetch-progress.jsonl (one `{"t": s, "record": {...}}` a line). Takes about 40 s
of both cores.

    .venv/bin/python bench/scale_record.py [--config configs/examples/tiny-lora.yml]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:] = [
    str(REPO),
    *(p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent),
]

import providers.registry  # noqa: E402, F401  (declares the clouds to jobs/ and core/, as the fleet's entries do)
from jobs.spec import load_job  # noqa: E402
from trainer.config import TrainJob  # noqa: E402
from trainer.progress import MARKER  # noqa: E402

OUT = REPO / "tests" / "data" / "replay"
RUN_ID = "recorded-run"


def record(command: str, job_file: Path, work: Path) -> list[dict[str, Any]]:
    """Run `python -m trainer COMMAND --job FILE`; its progress lines with their arrival (s from start)."""
    argv = [sys.executable, "-m", "trainer", command, "--job", str(job_file)]
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "RAY_"))}
    env["PYTHONUNBUFFERED"] = "1"
    with (work / f"{command}.log").open("w") as log:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        assert proc.stdout is not None
        for line in proc.stdout:
            at = line.find(MARKER)
            if at >= 0:
                rows.append(
                    {
                        "t": round(time.monotonic() - started, 3),
                        "record": json.loads(line[at + len(MARKER) :]),
                    }
                )
            log.write(line)
        if proc.wait() != 0:
            raise SystemExit(f"`trainer {command}` failed (exit {proc.returncode}); see {work / command}.log")
    return rows


def placeholders(rows: list[dict[str, Any]], job: TrainJob) -> list[dict[str, Any]]:
    """The rows with the run's directories and id written as placeholders (longest first), and what else
    names this machine's files as a node would name its own (`/node/...`)."""
    text = json.dumps(rows)
    for key in ("output_dir", "work_dir", "cache_dir", "run_id"):
        text = text.replace(str(getattr(job, key)), "{" + key + "}")
    text = text.replace(sys.executable, "/node/venv/bin/python").replace(str(REPO), "/node")
    replaced: list[dict[str, Any]] = json.loads(text)
    return replaced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs/examples/tiny-lora.yml")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-record-"))
    spec = load_job(args.config).spec
    run_dir = work / "runs" / RUN_ID
    job = TrainJob(
        run_id=RUN_ID,
        config=spec.train,
        work_dir=str(run_dir),
        output_dir=str(run_dir / spec.train.output_dir),
        cache_dir=str(REPO / "out" / "bench-models"),
        use_gpu=False,
    )
    job_file = work / "job.json"
    job_file.write_text(job.to_env())
    fetched = [r for r in record("fetch", job_file, work) if r["record"]["kind"] == "fetched"]
    train = record("train", job_file, work)
    OUT.mkdir(parents=True, exist_ok=True)
    for name, rows in (("fetch-progress.jsonl", fetched[-1:]), ("train-progress.jsonl", train)):
        lines = [json.dumps(row, separators=(",", ":")) for row in placeholders(rows, job)]
        (OUT / name).write_text("".join(line + "\n" for line in lines))
    kinds = [row["record"]["kind"] for row in train]
    print(f"recorded {len(train)} train lines over {train[-1]['t'] - train[0]['t']:.1f} s: {kinds}")
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"train_lines": len(train), "span_s": round(train[-1]["t"] - train[0]["t"], 3)}))


if __name__ == "__main__":
    main()
