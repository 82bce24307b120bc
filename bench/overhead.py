"""Orchestration overhead: `fleet run` against the trainer alone, on the same config, in one run.

Both sides start from the same warm model cache. The trainer alone is `python -m trainer train` on the
job's TrainJob (Ray Train with its own local cluster, as the node would run it). `fleet run` adds
everything else: an embedded Redis, a Celery worker, a local Ray head with token auth, the prepare job,
event relaying and teardown. Runs alternate (fleet, alone, fleet, alone, ...) so drift hits both.

    .venv/bin/python bench/overhead.py [--repeats 3] [--config configs/examples/tiny-lora.yml]

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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from jobs.spec import load_job  # noqa: E402
from service.embedded import stop_redis  # noqa: E402
from trainer.config import TrainJob  # noqa: E402


def timed(argv: list[str], env: dict[str, str], log: Path) -> float:
    start = time.perf_counter()
    with open(log, "wb") as out:
        done = subprocess.run(argv, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, timeout=900)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{argv[2:4]} failed (exit {done.returncode}); see {log}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs/examples/tiny-lora.yml")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tf-bench-"))
    home = work / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "RAY_")) and k != "REDIS_URL"}
    env.update(FLEET_HOME=str(home), FLEET_SETTINGS_FILE=str(work / "none.yml"))
    (work / "none.yml").write_text("{}\n")
    spec = load_job(args.config).spec

    def job_file(i: int) -> Path:
        run_dir = work / f"alone-{i}"
        job = TrainJob(
            run_id=f"alone-{i}",
            config=spec.train,
            work_dir=str(run_dir),
            output_dir=str(run_dir / spec.train.output_dir),
            cache_dir=str(home / "cache"),
            use_gpu=spec.gpu_count > 0,
        )
        path = work / f"job-{i}.json"
        path.write_text(job.to_env())
        return path

    # Warm-up: builds the tiny model into the shared cache and starts the embedded Redis.
    print("warm-up: one fleet run (builds the tiny model, starts the embedded Redis)", flush=True)
    warm = timed([sys.executable, "-m", "fleet", "run", str(args.config)], env, work / "warm.log")
    print(f"  warm-up fleet run: {warm:.1f} s", flush=True)
    fleet_s, alone_s = [], []
    try:
        for i in range(args.repeats):
            fleet_s.append(
                timed([sys.executable, "-m", "fleet", "run", str(args.config)], env, work / f"fleet-{i}.log")
            )
            alone_s.append(
                timed(
                    [sys.executable, "-m", "trainer", "train", "--job", str(job_file(i))],
                    env,
                    work / f"alone-{i}.log",
                )
            )
            print(
                f"  round {i + 1}: fleet run {fleet_s[-1]:.1f} s, trainer alone {alone_s[-1]:.1f} s",
                flush=True,
            )
    finally:
        stop_redis(home)
    ratios = [f / a for f, a in zip(fleet_s, alone_s, strict=True)]
    result = {
        "config": str(args.config.relative_to(REPO) if args.config.is_relative_to(REPO) else args.config),
        "repeats": args.repeats,
        "fleet_run_s": [round(x, 2) for x in fleet_s],
        "trainer_alone_s": [round(x, 2) for x in alone_s],
        "overhead_ratio_median": round(statistics.median(ratios), 3),
        "overhead_ratio_each": [round(r, 3) for r in ratios],
        "goal": 1.15,  # issue 21
        "logs": str(work),
    }
    median = result["overhead_ratio_median"]
    print(f"overhead ratio (fleet run / trainer alone), median of {args.repeats}: {median}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
