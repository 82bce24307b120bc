"""The trainer's W&B run, offline, read back from its own files: lifecycle, metrics, eval samples, end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.factories import train_config, train_job
from tests.wandb_log import OfflineRun, read_finished_run
from trainer import recipe
from trainer.config import WandbPlan
from trainer.errors import TrainingFailed
from trainer.tiny import resolve_model

pytestmark = pytest.mark.integration
LIFECYCLE = [
    {"t": 1.0, "event": "instance.requested", "price_per_hour": 0.2},
    {"t": 2.0, "event": "stage.finished", "stage": "provision", "seconds": 3.5},
    {"t": 3.0, "event": "prepare.fetched", "examples": 800, "download_bytes": 1234},
]


def offline_run(work: Path, run_id: str) -> OfflineRun:
    (log,) = work.glob(f"wandb/offline-run-*/run-{run_id}.wandb")
    return read_finished_run(log)


def test_an_offline_run_holds_the_whole_story(tmp_path: Path) -> None:
    config = train_config(
        max_steps=6, eval_steps=3, logging_steps=2, eval_table_size=2, eval_max_new_tokens=6
    )
    plan = WandbPlan(run_id="tf-t1", project="tiny", mode="offline", group="sw-1", lifecycle=LIFECYCLE)
    job = train_job(tmp_path, config, wandb=plan)
    recipe.run(job, resolve_model(config.base_model, tmp_path / "cache"))

    run = offline_run(tmp_path / "work", "tf-t1")
    assert run.run_id == "tf-t1" and run.project == "tiny" and run.exit_code == 0
    assert run.group == "sw-1"  # a sweep's runs show together
    assert run.config["learning_rate"] == config.learning_rate and run.config["fleet_run_id"] == job.run_id
    # Before training: the lifecycle, as a table and as numbers.
    assert run.summary["lifecycle/instance.requested/price_per_hour"] == 0.2
    assert run.summary["lifecycle/stage.finished/seconds"] == 3.5
    assert any("lifecycle/events.nrows" in row and row["lifecycle/events.nrows"] == 3 for row in run.history)
    # Training and eval metrics against the global step.
    losses = [(r["train/global_step"], r["train/loss"]) for r in run.history if "train/loss" in r]
    assert [step for step, _ in losses] == [2, 4, 6]
    evals = [r["train/global_step"] for r in run.history if "eval/loss" in r]
    assert evals == [0, 3, 6]
    assert run.summary["final/global_step"] == 6
    # The eval samples: a table per eval, in W&B and in the output's JSONL.
    tables = [r for r in run.history if r.get("eval/samples._type") == "table-file"]
    assert [t["train/global_step"] for t in tables] == [0, 3, 6] and all(
        t["eval/samples.nrows"] == 2 for t in tables
    )
    files = list((tmp_path / "work").glob("wandb/offline-run-*/files/" + tables[-1]["eval/samples.path"]))
    table = json.loads(files[0].read_text())
    assert table["columns"] == ["step", "input", "prediction", "label"] and len(table["data"]) == 2
    rows = [json.loads(line) for line in (tmp_path / "out" / "eval_samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 0, 3, 3, 6, 6]
    assert all(r["input"] and r["label"] and "prediction" in r for r in rows)
    assert rows[0]["input"].rstrip().endswith("### Response:")  # the prompt alone, decoded; the answer apart


def test_a_failed_training_says_why_and_ends_the_run_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_INJECT", "nan_at_step:*")
    config = train_config(max_steps=4, loss_watchdog_max_rollbacks=0, eval_table_size=0)
    job = train_job(tmp_path, config, wandb=WandbPlan(run_id="tf-t2", project="tiny", mode="offline"))
    with pytest.raises(TrainingFailed):
        recipe.run(job, resolve_model(config.base_model, tmp_path / "cache"))
    run = offline_run(tmp_path / "work", "tf-t2")
    assert run.exit_code == 1 and "nan" in run.summary["failure_reason"]
