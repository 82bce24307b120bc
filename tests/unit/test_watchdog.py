"""The loss watchdog: a NaN step or a loss above the threshold rolls back with half the learning rate; when
the rollbacks are spent the run fails with the reason. Plus the FLEET_INJECT hook that drives these tests."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from tests.factories import train_config, train_job
from trainer import faults, progress, recipe
from trainer.errors import JobError, TrainingFailed
from trainer.tiny import build_tiny
from trainer.watchdog import Reason, Watchdog


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("cache"))


def records(text: str) -> list[dict[str, Any]]:
    return list(progress.parse(text))


def test_nan_step_rolls_back_to_the_checkpoint_with_half_the_learning_rate(
    tmp_path: Path, model_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(faults.ENV_VAR, "nan_at_step:4")
    config = train_config(
        max_steps=6, save_steps=2, logging_steps=1, eval_steps=None, lr_scheduler="constant"
    )
    metrics = recipe.run(train_job(tmp_path, config), model_path)

    lines = records(capsys.readouterr().out)
    kinds = [(r["kind"], r.get("step")) for r in lines if r["kind"] in ("step", "rollback", "checkpoint")]
    assert kinds == [
        ("step", 1),
        ("step", 2),
        ("checkpoint", 2),
        ("step", 3),
        ("rollback", 4),  # step 4's loss was NaN: back to the step-2 checkpoint
        ("step", 3),
        ("step", 4),
        ("checkpoint", 4),
        ("step", 5),
        ("step", 6),
        ("checkpoint", 6),
    ]
    (rollback,) = [r for r in lines if r["kind"] == "rollback"]
    lr = config.learning_rate
    assert rollback == {
        "kind": "rollback",
        "step": 4,
        "to_step": 2,
        "reason": "non_finite",
        "loss": None,
        "learning_rate": pytest.approx(lr / 2),
        "rollbacks": 1,
    }
    rates = [r["learning_rate"] for r in lines if r["kind"] == "step"]
    assert rates == pytest.approx([lr] * 3 + [lr / 2] * 4)  # constant schedule: halved from the rollback on
    assert all(math.isfinite(r["loss"]) for r in lines if r["kind"] == "step")
    assert lines[-1]["kind"] == "finished" and metrics["global_step"] == 6
    assert math.isfinite(metrics["train_loss"]) and math.isfinite(metrics["eval_loss"])


def test_nan_at_every_step_fails_after_max_rollbacks(
    tmp_path: Path, model_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(faults.ENV_VAR, "nan_at_step:*")
    config = train_config(loss_watchdog_max_rollbacks=2, eval_steps=None, warmup_steps=0)
    with pytest.raises(TrainingFailed, match=r"^loss was nan at step 1 after 2 rollbacks"):
        recipe.run(train_job(tmp_path, config), model_path)
    lines = records(capsys.readouterr().out)
    rollbacks = [r for r in lines if r["kind"] == "rollback"]
    assert [(r["step"], r["to_step"], r["rollbacks"]) for r in rollbacks] == [(1, 0, 1), (1, 0, 2)]
    assert [r["learning_rate"] for r in rollbacks] == pytest.approx([0.001, 0.0005])
    assert not [r for r in lines if r["kind"] in ("step", "finished")]


def test_loss_above_threshold_for_patience_steps_rolls_back_then_fails(
    tmp_path: Path, model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = train_config(
        loss_watchdog_threshold=0.01,  # far below any loss this model reaches in a few steps
        loss_watchdog_patience=2,
        loss_watchdog_max_rollbacks=1,
        logging_steps=1,
        eval_steps=None,
    )
    with pytest.raises(TrainingFailed) as failed:
        recipe.run(train_job(tmp_path, config), model_path)
    assert str(failed.value).startswith(
        "loss was above loss_watchdog_threshold 0.01 for 2 logged steps in a row"
    )
    assert str(failed.value).endswith("at step 2) after 1 rollback (loss_watchdog_max_rollbacks: 1)")
    lines = records(capsys.readouterr().out)
    kinds = [(r["kind"], r.get("step")) for r in lines if r["kind"] in ("step", "rollback")]
    assert kinds == [("step", 1), ("step", 2), ("rollback", 2), ("step", 1), ("step", 2)]
    (rollback,) = [r for r in lines if r["kind"] == "rollback"]
    assert rollback["reason"] == "high_loss" and rollback["to_step"] == 0 and rollback["loss"] > 0.01


def test_watchdog_counts_high_losses_in_a_row() -> None:
    dog = Watchdog(threshold=1.0, patience=3, max_rollbacks=1)
    assert [dog.logged(step, loss) for step, loss in enumerate([2.0, 2.0, 0.5, 2.0, 2.0], 1)] == [None] * 5
    trip = dog.logged(6, 3.0)
    assert trip is not None and trip.reason == Reason.HIGH_LOSS and trip.step == 6
    dog.allow(trip, rollbacks=0)
    assert dog.high_streak == 0
    with pytest.raises(TrainingFailed, match="after 1 rollback "):
        dog.allow(trip, rollbacks=1)
    assert Watchdog(threshold=None, patience=1, max_rollbacks=0).logged(1, 1e9) is None


def test_fault_hook_parsing() -> None:
    none = faults.from_env({})
    assert not none.nan_at(1, 0) and not none.crash_after(1, 0) and none.memory_cap_bytes(0) is None
    hooks = faults.parse("nan_at_step:12@1, crash_after_step:3,memory_cap_mb:1.5")
    assert hooks.nan_at(12, 1) and not hooks.nan_at(12, 0) and not hooks.nan_at(11, 1)
    assert hooks.crash_after(3, 0) and hooks.crash_after(3, 5) and not hooks.crash_after(4, 0)
    assert hooks.memory_cap_bytes(0) == 1536 * 1024
    every = faults.parse("nan_at_step:*")
    assert every.nan_every_step() and every.nan_at(1, 0) and every.nan_at(99, 3)
    for bad in ("nan_at_step", "nan_at_step:0", "crash_after_step:*", "memory_cap_mb:-1", "oops:1", "x@1"):
        with pytest.raises(JobError, match=faults.ENV_VAR):
            faults.parse(bad)
