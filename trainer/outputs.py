"""What a run leaves on disk: checkpoints during training, and the results in output_dir at the end.

Rank 0 alone calls these. A checkpoint directory (``<work_dir>/checkpoints/step-N``) holds the adapter
(`save_pretrained`), `optimizer.pt`, `scheduler.pt` and `trainer_state.json`. The output directory holds
the adapter (adapter_config.json + adapter_model.safetensors), the tokenizer, `metrics.json` and the
model card README.md. The adapter's `base_model_name_or_path` is the job's `base_model` as given (the hub
id), never the node's local cache path.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainer import card
from trainer.config import TrainConfig

METRICS_FILE = "metrics.json"
STATE_FILE = "trainer_state.json"


def save_adapter(peft_model: Any, out: Path, base_model: str) -> None:
    """`save_pretrained` of the (unwrapped) PEFT model into `out`, recording `base_model` as its base."""
    for adapter_config in peft_model.peft_config.values():
        adapter_config.base_model_name_or_path = base_model
    out.mkdir(parents=True, exist_ok=True)
    # Embeddings are never trained here; "auto" would look the base model up on the hub to decide.
    peft_model.save_pretrained(str(out), save_embedding_layers=False)


def save_checkpoint(
    path: Path, peft_model: Any, optimizer: Any, scheduler: Any, state: Mapping[str, Any], base_model: str
) -> Path:
    """Write one checkpoint into `path` (replacing an older one of the same name); return `path`."""
    import torch

    if path.exists():
        shutil.rmtree(path)
    save_adapter(peft_model, path, base_model)
    torch.save(optimizer.state_dict(), path / "optimizer.pt")
    torch.save(scheduler.state_dict(), path / "scheduler.pt")
    (path / STATE_FILE).write_text(json.dumps(dict(state), indent=2) + "\n", encoding="utf-8")
    return path


def write_results(
    out: Path,
    *,
    peft_model: Any,
    tokenizer: Any,
    config: TrainConfig,
    metrics: Mapping[str, Any],
    run_id: str,
    target_modules: Sequence[str],
) -> None:
    """Write the adapter, tokenizer, metrics.json and README.md into `out` (created if missing).

    The card is written last, over the README.md that PEFT's `save_pretrained` leaves behind.
    """
    out.mkdir(parents=True, exist_ok=True)
    save_adapter(peft_model, out, config.base_model)
    tokenizer.save_pretrained(str(out))
    (out / METRICS_FILE).write_text(json.dumps(dict(metrics), indent=2) + "\n", encoding="utf-8")
    text = card.render(config, metrics, run_id=run_id, target_modules=target_modules)
    card.write(out / "README.md", text)
