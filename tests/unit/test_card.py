"""trainer.card: the model card parses with huggingface_hub, names the hub id and leaks no local path."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from tests.factories import TINY_DATA, train_config
from trainer.card import render

METRICS = {"eval_loss_first": 7.8, "eval_loss": 3.1, "train_loss": 3.9, "global_step": 90, "num_workers": 2}
TARGETS = ["q_proj", "v_proj"]


def test_card_parses_with_the_peft_metadata() -> None:
    text = render(train_config(), METRICS, run_id="r1", target_modules=TARGETS)
    card = ModelCard(text)
    data = {
        key: card.data.get(key) for key in ("base_model", "library_name", "pipeline_tag", "tags", "datasets")
    }
    assert data["base_model"] == "trainfleet/tiny-llama"
    assert data["library_name"] == "peft"
    assert data["pipeline_tag"] == "text-generation"
    assert data["tags"] == ["base_model:adapter:trainfleet/tiny-llama", "lora", "transformers", "trainfleet"]
    assert data["datasets"] == ["tiny-alpaca.jsonl"]
    assert "| eval loss after training | 3.1000 |" in card.text
    assert "| target modules | q_proj, v_proj |" in card.text


def test_card_keeps_hub_ids_and_relative_paths_as_given() -> None:
    config = train_config(
        base_model="someorg/some-model",
        datasets=[{"path": "data/mine.jsonl"}, {"path": "someorg/some-dataset"}],
        hub_model_id="me/my-adapter",
    )
    card = ModelCard(render(config, METRICS, run_id="r1", target_modules=TARGETS))
    assert card.data.get("base_model") == "someorg/some-model"
    assert card.data.get("datasets") == ["data/mine.jsonl", "someorg/some-dataset"]
    assert card.text.lstrip().startswith("# me/my-adapter")


def test_no_local_path_leaks(tmp_path: Path) -> None:
    local_model = tmp_path / "models" / "llama"
    local_model.mkdir(parents=True)
    config = train_config(base_model=str(local_model), datasets=[{"path": str(TINY_DATA)}])
    text = render(config, METRICS, run_id="r1", target_modules=TARGETS)
    card = ModelCard(text)
    assert card.data.get("base_model") is None
    assert not any(tag.startswith("base_model:") for tag in card.data.get("tags"))
    assert str(tmp_path) not in text and str(TINY_DATA.parent) not in text
    assert "/" not in "".join(card.data.get("datasets"))


def test_a_relative_local_model_dir_is_not_taken_for_a_hub_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "models" / "llama").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)  # "models/llama" looks like a hub id, but is a directory here
    card = ModelCard(
        render(train_config(base_model="models/llama"), METRICS, run_id="r1", target_modules=TARGETS)
    )
    assert card.data.get("base_model") is None
    assert card.data.get("tags") == ["lora", "transformers", "trainfleet"]


def test_shipped_datasets_the_job_and_the_wandb_run() -> None:
    """On a rented node the datasets have paths relative to what travelled there: the card names files."""
    config = train_config(datasets=[{"path": "datasets/0/tiny-alpaca.jsonl"}, {"path": "datasets/1/mine"}])
    job = "base_model: trainfleet/tiny-llama\nhub_model_id: me/tiny\n"
    url = "https://wandb.ai/me/demo/runs/tf-r1"
    card = ModelCard(
        render(config, METRICS, run_id="r1", target_modules=TARGETS, job_yaml=job, wandb_url=url)
    )
    assert card.data.get("datasets") == ["tiny-alpaca.jsonl", "mine"]
    assert f"```yaml\n{job}```" in card.text and f"[{url}]({url})" in card.text
    bare = render(config, METRICS, run_id="r1", target_modules=TARGETS)
    assert "## Job" not in bare and "W&B" not in bare


def test_the_card_says_what_the_run_computed_in_and_how_to_load_grown_embeddings() -> None:
    plain = ModelCard(render(train_config(), METRICS, run_id="r1", target_modules=TARGETS)).text
    assert "| precision | bf16: auto |" in plain  # the job's ask, when the metrics do not say
    assert "resize_token_embeddings" not in plain

    config = train_config(
        adapter="qlora",
        load_in_4bit=True,
        tokens=["<tool>"],
        lora_modules_to_save=["embed_tokens", "lm_head"],
    )
    card = ModelCard(
        render(config, {**METRICS, "precision": "bfloat16"}, run_id="r1", target_modules=TARGETS)
    ).text
    assert "| precision | bfloat16, base weights 4-bit NF4 |" in card
    assert "base.resize_token_embeddings(len(tokenizer))" in card  # the adapter's embeddings are larger
