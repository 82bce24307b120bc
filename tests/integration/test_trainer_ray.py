"""The example job, end to end on the node side: `python -m trainer train` with Ray Train, 2 CPU workers.

The command starts its own private local Ray cluster (RAY_TMPDIR points at a fresh short directory and
RAY_ADDRESS is unset) and must shut it down again; the test checks that no process of it outlives the
command, and kills any it finds.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.factories import example_config, train_job, trainer_command
from trainer import faults, progress
from trainer.config import TrainJob

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def ray_tmpdir() -> Iterator[Path]:
    # Short on purpose: Ray's Unix socket paths must stay under ~107 characters.
    path = Path(tempfile.mkdtemp(prefix="tfray-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def processes_of(ray_tmpdir: Path) -> list[psutil.Process]:
    """Every process whose command line names this test's Ray temp dir (Ray puts it in each one's)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(str(ray_tmpdir) in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def wait_until_gone(ray_tmpdir: Path, timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while (left := processes_of(ray_tmpdir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def train_with_ray(
    tmp_path: Path, ray_tmpdir: Path, job: TrainJob, inject: str | None = None
) -> tuple[str, float]:
    """Run `python -m trainer train --job FILE` for `job` (use_ray: it starts its own private Ray cluster)
    with FLEET_INJECT=`inject` if given; return its output and how long it took. Fails the test when it
    exits non-zero, takes over 240 s, or leaves a Ray process behind."""
    argv, env = trainer_command(tmp_path, job, RAY_TMPDIR=str(ray_tmpdir))
    if inject is not None:
        env[faults.ENV_VAR] = inject  # reaches the Train workers through the local cluster's environment

    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"`python -m trainer train` took over 240 s:\n{output[-4000:]}")
    finally:
        leftovers = wait_until_gone(ray_tmpdir, timeout=20)
        for leftover in leftovers:  # ours: they carry our private temp dir
            leftover.kill()
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, output[-4000:]
    assert not leftovers, f"Ray processes outlived the command: {[p.pid for p in leftovers]}"
    return output, elapsed


def short_ray_job(tmp_path: Path, **overrides: Any) -> TrainJob:
    """The example job (2 workers) cut to 6 steps, a STEP line each, a checkpoint every 2."""
    config = example_config(max_steps=6, save_steps=2, logging_steps=1, eval_steps=None, **overrides)
    return train_job(tmp_path, config)


def test_a_worker_crash_after_a_checkpoint_resumes_there(tmp_path: Path, ray_tmpdir: Path) -> None:
    """reliability.md F4: FailureConfig(max_failures=1), an exception after the step-2 checkpoint: Ray
    starts the workers again and they go on from step 2 to the same 6 steps."""
    job = short_ray_job(tmp_path, ray_max_failures=1)
    output, elapsed = train_with_ray(tmp_path, ray_tmpdir, job, inject="crash_after_step:2")

    assert "InjectedCrash" in output  # the workers did get FLEET_INJECT, and did crash
    records = list(progress.parse(output))
    kinds = [(r["kind"], r.get("step")) for r in records if r["kind"] != "eval"]
    assert kinds == [
        ("started", None),
        ("step", 1),
        ("step", 2),
        ("checkpoint", 2),
        ("started", None),  # the second attempt
        ("resumed", 2),
        ("step", 3),
        ("step", 4),
        ("checkpoint", 4),
        ("step", 5),
        ("step", 6),
        ("checkpoint", 6),
        ("finished", None),
        ("done", None),  # the command's last line
    ], kinds
    (resumed,) = [r for r in records if r["kind"] == "resumed"]
    assert resumed["total_steps"] == 6 and resumed["source"] in ("ray", "local")
    assert Path(resumed["path"], "trainer_state.json").is_file()
    metrics = records[-2]["metrics"]
    assert metrics["global_step"] == metrics["total_steps"] == 6 and metrics["num_workers"] == 2
    print(f"crash after step 2, resumed from {resumed['source']} {resumed['path']}: {elapsed:.1f} s")


def test_a_nan_on_one_worker_rolls_every_worker_back(tmp_path: Path, ray_tmpdir: Path) -> None:
    """Rank 1's loss alone is NaN at step 3: both ranks roll back to the step-2 checkpoint together (a rank
    that did not would leave the other waiting in a collective) and finish the 6 steps."""
    job = short_ray_job(tmp_path, lr_scheduler="constant")
    output, elapsed = train_with_ray(tmp_path, ray_tmpdir, job, inject="nan_at_step:3@1")

    records = list(progress.parse(output))
    kinds = [(r["kind"], r.get("step")) for r in records if r["kind"] in ("step", "rollback")]
    assert kinds == [
        ("step", 1),
        ("step", 2),
        ("rollback", 3),
        ("step", 3),
        ("step", 4),
        ("step", 5),
        ("step", 6),
    ]
    (rollback,) = [r for r in records if r["kind"] == "rollback"]
    lr = job.config.learning_rate
    assert rollback["to_step"] == 2 and rollback["reason"] == "non_finite" and rollback["rollbacks"] == 1
    assert rollback["learning_rate"] == pytest.approx(lr / 2)
    steps = [r for r in records if r["kind"] == "step"]
    assert all(math.isfinite(r["loss"]) for r in steps)
    assert [r["learning_rate"] for r in steps] == pytest.approx([lr] * 2 + [lr / 2] * 4)
    assert [r["kind"] for r in records[-2:]] == ["finished", "done"]
    assert records[-2]["metrics"]["global_step"] == 6
    print(f"NaN on rank 1 at step 3, rolled back on both: {elapsed:.1f} s")
