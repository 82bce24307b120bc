"""Resuming: checkpoints are written atomically, and a job started again after a crash goes on from its
newest checkpoint, ending exactly where an uninterrupted run ends (same data order, RNG and optimizer)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.factories import train_config, train_job, write_completion_data
from trainer import faults, outputs, progress, recipe
from trainer.config import TrainConfig
from trainer.faults import InjectedCrash
from trainer.tiny import build_tiny


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("cache"))


def records(text: str) -> list[dict[str, Any]]:
    return list(progress.parse(text))


def adapter_weights(directory: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    weights: dict[str, Any] = load_file(str(directory / "adapter_model.safetensors"))
    return weights


def small_config(data: Path) -> TrainConfig:
    # 12 texts, 2 for eval: 5 micro batches of 2 per epoch, in windows of 2, 2 and 1 (3 steps per epoch);
    # dropout makes the RNG matter, the small data makes step 5 fall in the second epoch.
    return train_config(
        datasets=[{"path": str(data), "type": "completion"}],
        micro_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=7,
        val_set_size=2,
        eval_steps=None,
        save_steps=4,
        logging_steps=1,
        lora_dropout=0.1,
    )


def test_crashed_job_resumes_from_its_checkpoint(
    tmp_path: Path, model_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    config = small_config(write_completion_data(tmp_path / "texts.jsonl", 12))
    straight = train_job(tmp_path / "straight", config)
    expected = recipe.run(straight, model_path)
    expected_steps = {r["step"]: r for r in records(capsys.readouterr().out) if r["kind"] == "step"}

    job = train_job(tmp_path / "crashed", config)
    monkeypatch.setenv(faults.ENV_VAR, "crash_after_step:5")
    with pytest.raises(InjectedCrash):
        recipe.run(job, model_path)
    first = records(capsys.readouterr().out)
    assert [r["step"] for r in first if r["kind"] == "step"] == [1, 2, 3, 4, 5]
    assert [r["step"] for r in first if r["kind"] == "checkpoint"] == [4]

    monkeypatch.delenv(faults.ENV_VAR)
    metrics = recipe.run(job, model_path)  # the same job again: goes on from step 4
    second = records(capsys.readouterr().out)
    checkpoint = Path(job.work_dir) / "checkpoints" / "step-4"
    assert [r["kind"] for r in second[:2]] == ["started", "resumed"]
    assert second[0]["total_steps"] == 7
    assert second[1] == {
        "kind": "resumed",
        "step": 4,
        "total_steps": 7,
        "path": str(checkpoint),
        "source": "local",
    }
    steps = [r for r in second if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [5, 6, 7]
    for r in steps:  # the same batches, dropout masks and optimizer state as the uninterrupted run
        assert r["loss"] == pytest.approx(expected_steps[r["step"]]["loss"], abs=1e-6), r
        assert r["epoch"] == expected_steps[r["step"]]["epoch"]
        assert r["learning_rate"] == pytest.approx(expected_steps[r["step"]]["learning_rate"])
    assert second[-1]["kind"] == "finished"
    assert metrics["global_step"] == 7 and metrics["epoch"] == expected["epoch"]
    assert metrics["eval_loss_first"] == pytest.approx(expected["eval_loss_first"])
    assert metrics["eval_loss"] == pytest.approx(expected["eval_loss"], abs=1e-5)
    assert metrics["train_loss"] == pytest.approx(expected["train_loss"], abs=1e-6)

    ours, theirs = adapter_weights(Path(job.output_dir)), adapter_weights(Path(straight.output_dir))
    assert ours.keys() == theirs.keys()
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor, theirs[name], rtol=0, atol=1e-6, msg=name)

    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["global_step"] == 4 and state["epoch_index"] == 1 and state["batches_done"] == 2
    assert (checkpoint / "rng_state.pt").is_file()


def test_latest_checkpoint_skips_incomplete_ones(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    assert outputs.latest_checkpoint(root) is None

    def fake(name: str, step: int, *, missing: str | None = None) -> Path:
        path = root / name
        path.mkdir(parents=True)
        for file in outputs.CHECKPOINT_FILES:
            if file != missing:
                (path / file).write_text("{}")
        if missing != outputs.STATE_FILE:
            (path / outputs.STATE_FILE).write_text(json.dumps({"global_step": step}))
        return path

    fake("step-2", 2)
    ten = fake("step-10", 10)
    fake("step-12", 12, missing=outputs.STATE_FILE)  # crashed before the state file
    fake("step-14", 14, missing="optimizer.pt")
    fake(".step-16.partial-123", 16)  # a save in progress
    fake("step-18", 18).joinpath(outputs.STATE_FILE).write_text("{not json")
    assert outputs.latest_checkpoint(root) == ten
