"""trainer.recipe: short single-process runs write the results, sane metrics and parseable progress."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.factories import train_config, train_job
from trainer import lora, progress, recipe, recipe_setup
from trainer.tiny import build_tiny


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("cache"))


def records(text: str) -> list[dict[str, Any]]:
    return list(progress.parse(text))


def test_short_run_writes_results(
    tmp_path: Path, model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = train_job(tmp_path, train_config(learning_rate=0.01))
    metrics = recipe.run(job, model_path)

    lines = records(capsys.readouterr().out)
    kinds = [(r["kind"], r.get("step")) for r in lines]
    assert kinds == [
        ("started", None),
        ("eval", 0),
        ("step", 2),
        ("eval", 2),
        ("checkpoint", 3),
        ("step", 4),
        ("eval", 4),
        ("finished", None),
    ]
    started, finished = lines[0], lines[-1]
    assert started == {
        "kind": "started",
        "total_steps": 4,
        "num_workers": 1,
        "nodes": ["local"],  # no Ray: one process
        "num_nodes": 1,
        "train_examples": 792,
        "eval_examples": 8,
        "python": sys.executable,  # the interpreter that trains (on a node: the node environment's)
        "precision": "float32",  # what the forward passes computed in (`bf16: auto` on a CPU)
    }
    assert finished["metrics"] == metrics and finished["output_dir"] == job.output_dir
    assert all(math.isfinite(r["loss"]) and r["learning_rate"] >= 0 for r in lines if r["kind"] == "step")

    assert metrics["global_step"] == 4 and metrics["num_workers"] == 1
    assert lines[1]["eval_loss"] == pytest.approx(metrics["eval_loss_first"], abs=1e-6)
    assert lines[-2]["eval_loss"] == pytest.approx(metrics["eval_loss"], abs=1e-6)
    assert 0 < metrics["eval_loss"] < metrics["eval_loss_first"]  # deterministic: seed 42, lr 0.01
    assert math.isfinite(metrics["train_loss"]) and metrics["train_runtime_s"] > 0
    assert 0 < metrics["trainable_params"] < metrics["total_params"]

    out = Path(job.output_dir)
    for name in (
        "adapter_config.json",
        "adapter_model.safetensors",
        "tokenizer.json",
        "metrics.json",
        "README.md",
    ):
        assert (out / name).is_file(), name
    assert json.loads((out / "metrics.json").read_text()) == metrics
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == "trainfleet/tiny-llama"
    assert sorted(adapter["target_modules"]) == ["q_proj", "v_proj"]
    assert str(model_path) not in (out / "README.md").read_text()

    checkpoint = Path(job.work_dir) / "checkpoints" / "step-3"
    for name in ("adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"):
        assert (checkpoint / name).is_file(), name
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == 3


def test_adapter_loads_with_peft(tmp_path: Path, model_path: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    job = train_job(tmp_path, train_config(max_steps=2, eval_steps=None, save_steps=None, val_set_size=0))
    metrics = recipe.run(job, model_path)
    assert metrics["eval_loss"] is None and metrics["eval_examples"] == 0
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_path), job.output_dir)
    lora_b = [p for name, p in model.named_parameters() if "lora_B" in name]
    assert lora_b and any(bool(torch.any(p != 0)) for p in lora_b)  # trained, not the zero init


def test_accumulation_and_epochs(
    tmp_path: Path, model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": f"A cow says moo {i}."}) + "\n" for i in range(12)))
    config = train_config(
        datasets=[{"path": str(data), "type": "completion"}],
        max_steps=None,
        num_epochs=2,
        micro_batch_size=2,  # 10 train examples: 5 micro batches per epoch,
        gradient_accumulation_steps=2,  # in windows of 2, 2 and 1: 3 steps per epoch
        val_set_size=2,
        eval_steps=None,
        save_steps=None,
        logging_steps=1,
        optimizer="sgd",
        lr_scheduler="linear",
        warmup_steps=None,
        warmup_ratio=0.5,
    )
    metrics = recipe.run(train_job(tmp_path, config), model_path)
    steps = [r for r in records(capsys.readouterr().out) if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    assert [r["epoch"] for r in steps] == pytest.approx([0.4, 0.8, 1.0, 1.4, 1.8, 2.0])
    assert steps[0]["learning_rate"] == pytest.approx(0.002 / 3)  # warmup_ratio 0.5 of 6 steps: 3
    assert metrics["global_step"] == 6 and metrics["epoch"] == 2.0


def test_lora_targets(model_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path)
    every = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    assert lora.lora_targets(model, train_config()) == ["q_proj", "v_proj"]
    assert lora.lora_targets(model, train_config(lora_target_linear=True)) == every
    assert lora.lora_targets(model, train_config(lora_target_modules=["o_proj"])) == ["o_proj"]


@pytest.mark.parametrize(
    ("batches", "overrides", "expected"),
    [
        (45, {"num_epochs": 2, "max_steps": None}, (45, 90)),
        (45, {"num_epochs": 2, "max_steps": None, "gradient_accumulation_steps": 4}, (12, 24)),
        (45, {"num_epochs": 0.5, "max_steps": None}, (45, 23)),
        (45, {"num_epochs": 2, "max_steps": 7}, (45, 7)),
        (45, {"num_epochs": 1, "max_steps": 100}, (45, 100)),
    ],
)
def test_plan_steps(batches: int, overrides: dict[str, Any], expected: tuple[int, int]) -> None:
    assert recipe_setup.plan_steps(batches, train_config(**overrides)) == expected


def test_warmup_steps() -> None:
    assert recipe_setup.warmup_steps(train_config(warmup_steps=5), 100) == 5
    assert recipe_setup.warmup_steps(train_config(warmup_steps=None, warmup_ratio=0.05), 90) == 5
    assert recipe_setup.warmup_steps(train_config(warmup_steps=None), 90) == 0
