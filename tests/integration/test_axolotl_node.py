"""An axolotl job on the node, for real: `python -m trainer train` in the axolotl environment (.venv-axolotl,
`make axolotl-env`) runs axolotl 0.19 on the tiny model on this CPU, and the fleet sees what a builtin run
shows it: progress lines, the adapter with its hub id, the card, metrics, eval samples, the W&B run it
planned; a tripped loss watchdog fails the run. Plus the readiness check of an axolotl node.

A missing .venv-axolotl fails these tests (it does not skip them): the environment is part of the setup.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.node_settings import DEFAULT_AXOLOTL_VERSION
from tests.factories import REPO_ROOT, axolotl_config, train_job
from tests.wandb_log import read_finished_run
from trainer import faults, progress
from trainer.config import TrainJob, WandbPlan

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
AXOLOTL_PYTHON = REPO_ROOT / ".venv-axolotl" / "bin" / "python"
LIFECYCLE = [{"t": 1.0, "event": "instance.requested", "price_per_hour": 0.2}]


@pytest.fixture(scope="module")
def axolotl_python() -> Path:
    if not AXOLOTL_PYTHON.exists():
        pytest.fail(
            f"{AXOLOTL_PYTHON} is missing: run `make axolotl-env` (axolotl's environment for its jobs)"
        )
    return AXOLOTL_PYTHON


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("cache")  # the tiny model, built once for both runs


def node_env(tmp_path: Path) -> dict[str, str]:
    """This environment without Ray's or the fleet's variables, offline (the model and data are local)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAY_", "WANDB_")) and k not in (progress.ENV_VAR, faults.ENV_VAR)
    }
    env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", WANDB_DIR=str(tmp_path / "wandb"))
    return env


def train(python: Path, tmp_path: Path, job: TrainJob) -> tuple[subprocess.CompletedProcess[str], list[Any]]:
    job_file = tmp_path / "job.json"
    job_file.write_text(job.to_env(), encoding="utf-8")
    done = subprocess.run(
        [str(python), "-m", "trainer", "train", "--job", str(job_file)],
        cwd=REPO_ROOT,
        env=node_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=280,
    )
    return done, list(progress.parse(done.stdout))


def test_an_axolotl_job_leaves_what_a_builtin_one_does(
    axolotl_python: Path, tmp_path: Path, model_cache: Path
) -> None:
    plan = WandbPlan(run_id="tf-ax1", project="tiny", mode="offline", lifecycle=LIFECYCLE)
    job = train_job(tmp_path, axolotl_config(), cache_dir=model_cache, wandb=plan)
    done, records = train(axolotl_python, tmp_path, job)
    assert done.returncode == 0, done.stderr[-4000:]
    kinds = [r["kind"] for r in records]
    for kind in ("started", "step", "eval", "checkpoint", "finished"):
        assert kind in kinds, (kind, kinds, done.stderr[-3000:])
    started = next(r for r in records if r["kind"] == "started")
    assert started["total_steps"] == 6 and started["num_workers"] == 1 and started["train_examples"] > 0
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6] and all(math.isfinite(r["loss"]) for r in steps)
    assert [r["step"] for r in records if r["kind"] == "checkpoint"] == [3, 6]
    finished, last = records[-2:]  # the result, then the command's last line (its exit is not waited for)
    assert finished["kind"] == "finished" and finished["metrics"]["global_step"] == 6
    assert last == {"kind": "done"}
    assert finished["metrics"]["eval_loss"] < finished["metrics"]["eval_loss_first"]

    out = Path(job.output_dir)
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == "trainfleet/tiny-llama"  # not this node's cache path
    assert (out / "adapter_model.safetensors").is_file() and (out / "checkpoint-6").is_dir()
    assert json.loads((out / "metrics.json").read_text()) == finished["metrics"]
    card = (out / "README.md").read_text()
    assert f"axolotl {DEFAULT_AXOLOTL_VERSION}" in card and "base_model: trainfleet/tiny-llama" in card
    samples = [json.loads(line) for line in (out / "eval_samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == {r["step"] for r in records if r["kind"] == "eval"}
    assert all(s["input"].rstrip().endswith("### Response:") and s["label"] for s in samples)

    (log,) = (tmp_path / "wandb").glob("wandb/offline-run-*/run-tf-ax1.wandb")
    run = read_finished_run(log)
    assert run.run_id == "tf-ax1" and run.project == "tiny" and run.exit_code == 0
    assert run.summary["lifecycle/instance.requested/price_per_hour"] == 0.2  # the fleet's lifecycle
    assert any("eval/loss" in row for row in run.history)  # axolotl's own metrics


def test_a_tripped_loss_watchdog_fails_the_run(
    axolotl_python: Path, tmp_path: Path, model_cache: Path
) -> None:
    config = axolotl_config(
        max_steps=3,
        val_set_size=0,
        eval_steps=None,
        save_steps=None,
        loss_watchdog_threshold=0.001,
        loss_watchdog_patience=1,
    )
    done, records = train(axolotl_python, tmp_path, train_job(tmp_path, config, cache_dir=model_cache))
    assert done.returncode == 1, done.stderr[-3000:]
    (step,) = [r for r in records if r["kind"] == "step"]  # stopped at the first logged step
    error = [line for line in done.stderr.splitlines() if line.startswith("trainer: error:")]
    assert error == [
        "trainer: error: loss watchdog: the logged loss was above loss_watchdog_threshold 0.001 for "
        f"loss_watchdog_patience 1 logged steps in a row ({step['loss']:.6g} at step 1); "
        "training stopped"
    ], done.stderr[-3000:]
    assert "finished" not in [r["kind"] for r in records]


def test_the_axolotl_environment_passes_the_readiness_check(axolotl_python: Path) -> None:
    done = subprocess.run(
        [
            str(axolotl_python),
            "-m",
            "trainer",
            "check",
            "--python",
            "3.11",
            f"--axolotl={DEFAULT_AXOLOTL_VERSION}",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (checked,) = progress.parse(done.stdout)
    assert checked["problems"] == [] and checked["versions"]["axolotl"] == DEFAULT_AXOLOTL_VERSION
