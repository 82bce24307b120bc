"""Object builders shared by the tests. Add new builders here rather than in the tests themselves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from trainer.config import TrainConfig, TrainJob

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_YAML = REPO_ROOT / "configs" / "examples" / "tiny-lora.yml"
TINY_DATA = REPO_ROOT / "configs" / "examples" / "data" / "tiny-alpaca.jsonl"


def example_config(**overrides: Any) -> TrainConfig:
    """The example job's TrainConfig (configs/examples/tiny-lora.yml), dataset paths made absolute (they
    are relative to the YAML file), with `overrides` applied on top."""
    raw = yaml.safe_load(EXAMPLE_YAML.read_text(encoding="utf-8"))
    for ds in raw["datasets"]:
        ds["path"] = str((EXAMPLE_YAML.parent / ds["path"]).resolve())
    raw.update(overrides)
    return TrainConfig.model_validate(raw)


def train_config(**overrides: Any) -> TrainConfig:
    """A small config on the bundled dataset for fast single-process runs (no Ray)."""
    values: dict[str, Any] = {
        "base_model": "trainfleet/tiny-llama",
        "datasets": [{"path": str(TINY_DATA), "type": "alpaca"}],
        "lora_r": 4,
        "lora_alpha": 8,
        "sequence_len": 96,
        "micro_batch_size": 4,
        "max_steps": 4,
        "learning_rate": 0.002,
        "warmup_steps": 1,
        "val_set_size": 8,
        "eval_steps": 2,
        "save_steps": 3,
        "logging_steps": 2,
    }
    values.update(overrides)
    return TrainConfig.model_validate(values)


def train_job(
    root: Path, config: TrainConfig | None = None, *, cache_dir: Path | None = None, **fields: Any
) -> TrainJob:
    """A TrainJob whose directories live under `root` (work/, out/, and cache/ unless `cache_dir`)."""
    values: dict[str, Any] = {
        "run_id": "run-test",
        "config": config if config is not None else train_config(),
        "work_dir": str(root / "work"),
        "output_dir": str(root / "out"),
        "cache_dir": str(cache_dir if cache_dir is not None else root / "cache"),
    }
    values.update(fields)
    return TrainJob.model_validate(values)


def write_completion_data(path: Path, count: int) -> Path:
    """A small `completion` JSONL dataset of `count` distinct texts at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": f"A cow says moo {i}."}) + "\n" for i in range(count)))
    return path
