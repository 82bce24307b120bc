"""trainer.extras in the builtin recipe: lora_modules_to_save, special_tokens / tokens, saves_per_epoch,
evals_per_epoch and save_total_limit, on the tiny model; and the conflicts fleet validate refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigError, Problem
from jobs.spec import parse_job
from tests.factories import train_config, train_job, write_completion_data
from trainer import extras, faults, outputs, progress, recipe
from trainer.config import TrainConfig
from trainer.errors import JobError
from trainer.faults import InjectedCrash
from trainer.tiny import build_tiny

JOB = (
    "base_model: trainfleet/tiny-llama\ndatasets:\n  - path: tatsu-lab/alpaca\n    type: alpaca\n"
    + "adapter: lora\n"
)
EMBEDDINGS = ["embed_tokens", "lm_head"]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("cache"))


def records(text: str) -> list[dict[str, Any]]:
    return list(progress.parse(text))


def texts_config(data: Path, **overrides: Any) -> TrainConfig:
    """Completion texts in micro batches of 2, no scheduled eval or save unless `overrides` ask."""
    values: dict[str, Any] = {
        "datasets": [{"path": str(data), "type": "completion"}],
        "micro_batch_size": 2,
        "max_steps": None,
        "num_epochs": 1,
        "val_set_size": 0,
        "eval_steps": None,
        "save_steps": None,
        "eval_table_size": 0,
        "logging_steps": 1,
    }
    values.update(overrides)
    return train_config(**values)


def adapter_weights(directory: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    weights: dict[str, Any] = load_file(str(directory / outputs.ADAPTER_FILE))
    return weights


def test_modules_to_save_train_in_full_and_are_saved_with_the_adapter(
    tmp_path: Path, model_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    data = write_completion_data(tmp_path / "texts.jsonl", 4)
    job = train_job(tmp_path, texts_config(data, lora_modules_to_save=EMBEDDINGS, learning_rate=0.01))
    recipe.run(job, model_path)

    out = Path(job.output_dir)
    assert sorted(json.loads((out / "adapter_config.json").read_text())["modules_to_save"]) == EMBEDDINGS
    saved = adapter_weights(out)
    base = AutoModelForCausalLM.from_pretrained(str(model_path))
    for layer, original in (
        ("embed_tokens", base.get_input_embeddings().weight),
        ("lm_head", base.get_output_embeddings().weight),
    ):
        (key,) = [k for k in saved if layer in k]
        assert saved[key].shape == original.shape  # the whole layer, not a low-rank update
        assert not torch.equal(saved[key], original), f"{layer} did not train"


def test_special_tokens_and_tokens_grow_the_vocabulary_and_the_result_loads(
    tmp_path: Path, model_path: Path
) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # The tiny tokenizer has fewer tokens than the model's 2048 embedding rows: add enough to outgrow them.
    have = len(AutoTokenizer.from_pretrained(str(model_path)))
    added = [f"<|t{i}|>" for i in range(2048 - have + 1)]
    data = write_completion_data(tmp_path / "texts.jsonl", 4)
    config = texts_config(
        data, special_tokens={"pad_token": "<|pad|>"}, tokens=added, lora_modules_to_save=EMBEDDINGS
    )
    job = train_job(tmp_path, config)
    recipe.run(job, model_path)

    out = Path(job.output_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert tokenizer.pad_token == "<|pad|>" and len(tokenizer) == 2050
    assert tokenizer.convert_tokens_to_ids(added[-1]) == 2049
    (embed,) = [v for k, v in adapter_weights(out).items() if "embed_tokens" in k]
    assert embed.shape[0] == 2050
    base = AutoModelForCausalLM.from_pretrained(str(model_path))
    base.resize_token_embeddings(len(tokenizer))  # as a user loads it: the base grown to the tokenizer first
    model = PeftModel.from_pretrained(base, str(out))
    ids = tokenizer(f"A cow {added[-1]} says", return_tensors="pt")["input_ids"]
    assert 2049 in ids[0].tolist()
    with torch.no_grad():
        assert model(input_ids=ids).logits.shape[-1] == 2050
    torch.testing.assert_close(model.get_input_embeddings().weight, embed)


def test_a_new_token_to_learn_needs_the_embeddings_trained(tmp_path: Path, model_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    pad_only = train_config(special_tokens={"pad_token": "<|pad|>", "bos_token": "<s>"})
    added = extras.add_tokens(tokenizer, pad_only)
    assert added.new == ("special_tokens.pad_token",) and added.to_learn == ()  # <s> is the tokenizer's
    extras.require_trainable(added, pad_only)  # a pad token is never learnt: no embeddings needed

    eos = train_config(special_tokens={"eos_token": "<|im_end|>"})
    with pytest.raises(JobError, match=r"special_tokens.eos_token: new to the tokenizer.*modules_to_save"):
        extras.require_trainable(extras.add_tokens(tokenizer, eos), eos)

    data = write_completion_data(tmp_path / "texts.jsonl", 4)
    wrong = texts_config(data, special_tokens={"eos_token": "<|im_end|>"}, lora_modules_to_save=["lm_head"])
    with pytest.raises(JobError, match=r"set lora_modules_to_save to \[embed_tokens, lm_head\]"):
        recipe.run(train_job(tmp_path / "a", wrong), model_path)
    typo = texts_config(data, lora_modules_to_save=["embed_token"])
    with pytest.raises(JobError, match="no module named embed_token; its embedding layers are embed_tokens"):
        recipe.run(train_job(tmp_path / "b", typo), model_path)


def test_saves_and_evals_per_epoch_schedule_from_the_steps_of_an_epoch(
    tmp_path: Path, model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert extras.interval(None, 2, 5) == 3  # rounded up: at most N per epoch
    assert extras.interval(None, 10, 3) == 1 and extras.interval(4, None, 5) == 4
    assert extras.interval(None, None, 5) is None

    # 10 texts, 2 for eval: 4 micro batches of 2, so 4 optimizer steps in the one epoch.
    data = write_completion_data(tmp_path / "texts.jsonl", 10)
    config = texts_config(data, val_set_size=2, saves_per_epoch=2, evals_per_epoch=4)
    job = train_job(tmp_path, config)
    recipe.run(job, model_path)

    lines = records(capsys.readouterr().out)
    assert [r["step"] for r in lines if r["kind"] == "checkpoint"] == [2, 4]
    assert [r["step"] for r in lines if r["kind"] == "eval"] == [0, 1, 2, 3, 4]  # 4 a epoch, and the end
    checkpoints = Path(job.work_dir) / outputs.CHECKPOINTS_DIR
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-2", "step-4"]


def test_save_total_limit_keeps_the_newest_and_a_resume_still_works(
    tmp_path: Path, model_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # 12 texts, 2 for eval: 5 micro batches of 2 per epoch in windows of 2, 2 and 1 (3 steps an epoch).
    data = write_completion_data(tmp_path / "texts.jsonl", 12)
    config = texts_config(
        data, gradient_accumulation_steps=2, max_steps=7, val_set_size=2, save_steps=2, save_total_limit=1
    )
    job = train_job(tmp_path, config)
    checkpoints = Path(job.work_dir) / outputs.CHECKPOINTS_DIR
    monkeypatch.setenv(faults.ENV_VAR, "crash_after_step:5")
    with pytest.raises(InjectedCrash):
        recipe.run(job, model_path)
    first = records(capsys.readouterr().out)
    assert [r["step"] for r in first if r["kind"] == "checkpoint"] == [2, 4]
    assert [p.name for p in checkpoints.iterdir()] == ["step-4"]

    monkeypatch.delenv(faults.ENV_VAR)
    metrics = recipe.run(job, model_path)
    second = records(capsys.readouterr().out)
    assert second[1]["kind"] == "resumed" and second[1]["step"] == 4
    assert [r["step"] for r in second if r["kind"] == "step"] == [5, 6, 7]
    assert metrics["global_step"] == 7
    assert [p.name for p in checkpoints.iterdir()] == ["step-6"]


def test_pruning_keeps_the_current_checkpoint_and_newer_ones(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"

    def fake(step: int, *, complete: bool = True) -> Path:
        path = root / f"step-{step}"
        path.mkdir(parents=True)
        for name in outputs.CHECKPOINT_FILES if complete else ():
            (path / name).write_text("{}")
        (path / outputs.STATE_FILE).write_text(json.dumps({"global_step": step}))
        return path

    for step in (2, 4, 6):
        fake(step)
    fake(8, complete=False)  # a save cut short
    current, newer = fake(10), fake(12)  # resumed from 10 while a newer one stands: never ours to delete
    deleted = outputs.prune_checkpoints(current, 2)
    assert sorted(p.name for p in deleted) == ["step-2", "step-4", "step-8"]
    assert sorted(p.name for p in root.iterdir()) == ["step-10", "step-12", "step-6"]
    assert outputs.prune_checkpoints(newer, 1) == [current, root / "step-6"]
    assert [p.name for p in root.iterdir()] == ["step-12"]


def problems_of(text: str) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        parse_job(text.encode(), source="job.yml", base_dir=Path.cwd())
    return info.value.problems


def test_validate_refuses_the_conflicts_by_key_and_line() -> None:
    (saves,) = problems_of(JOB + "saves_per_epoch: 2\nsave_steps: 10\n")
    assert (saves.path, saves.line) == ("save_steps", 7)
    assert "save_steps and saves_per_epoch are mutually exclusive" in saves.message
    (evals,) = problems_of(JOB + "evals_per_epoch: 4\neval_steps: 5\n")
    assert (evals.path, evals.line) == ("eval_steps", 7)
    assert "eval_steps and evals_per_epoch are mutually exclusive" in evals.message
    (tokens,) = problems_of(JOB + "tokens: ['<|x|>']\n")
    assert tokens.path == "tokens" and "`lora_modules_to_save` not properly set" in tokens.message
    (unknown,) = problems_of(JOB + "special_tokens:\n  sep_token: '|'\n")
    assert unknown.path == "special_tokens.sep_token"

    text = JOB + "saves_per_epoch: 2\nsave_total_limit: 1\n"
    fine = parse_job(text.encode(), source="job.yml", base_dir=Path.cwd())
    assert isinstance(fine.spec.train, TrainConfig) and fine.spec.train.saves_per_epoch == 2
    assert extras.ray_checkpoint_config(fine.spec.train).num_to_keep == 1  # Ray's storage keeps as many
