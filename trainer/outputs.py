"""What a run leaves on disk: checkpoints during training, and the results in output_dir at the end.

Rank 0 alone writes these. A checkpoint directory (``<work_dir>/checkpoints/step-N``) holds the adapter
(`save_pretrained`), `optimizer.pt`, `scheduler.pt`, `rng_state.pt` and `trainer_state.json` (the loop's
position, trainer.snapshot.Position, plus the run's shape: total steps, micro batch, accumulation, workers).
It is written into a hidden sibling directory and renamed into place, so a crash never leaves a half-written
`step-N`; `latest_checkpoint` only considers directories that hold every file. The output directory holds
the adapter (adapter_config.json + adapter_model.safetensors), the tokenizer, `metrics.json` and the
model card README.md. The adapter's `base_model_name_or_path` is the job's `base_model` as given (the hub
id), never the node's local cache path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from trainer import card
from trainer.config import TrainConfig
from trainer.snapshot import Position, PositionState, Snapshot

METRICS_FILE = "metrics.json"
STATE_FILE = "trainer_state.json"
CHECKPOINTS_DIR = "checkpoints"  # under work_dir
OPTIMIZER_FILE, SCHEDULER_FILE, RNG_FILE = "optimizer.pt", "scheduler.pt", "rng_state.pt"
ADAPTER_FILE = "adapter_model.safetensors"
# Without these a checkpoint directory is incomplete (rng_state.pt is optional).
CHECKPOINT_FILES = ("adapter_config.json", ADAPTER_FILE, OPTIMIZER_FILE, SCHEDULER_FILE, STATE_FILE)
CHECKPOINT_NAME = re.compile(r"step-(\d+)")


class TrainerState(PositionState):
    """A checkpoint's trainer_state.json: the loop's position, then the run's shape (older checkpoints may
    lack these; `train_loss_sum` is each rank's share of the sum)."""

    total_steps: NotRequired[int]
    micro_batch_size: NotRequired[int]
    gradient_accumulation_steps: NotRequired[int]
    world_size: NotRequired[int]


class Metrics(TypedDict):
    """A run's final metrics: metrics.json, the FINISHED line's `metrics` (trainer.recipe.run has them)."""

    eval_loss_first: float | None
    eval_loss: float | None
    train_loss: float
    global_step: int
    total_steps: int
    epoch: float
    train_runtime_s: float
    train_examples: int
    eval_examples: int
    dropped_examples: int
    num_workers: int
    trainable_params: int
    total_params: int
    precision: str  # what the forward passes computed in: bfloat16, float16 or float32


def save_adapter(peft_model: Any, out: Path, base_model: str) -> None:
    """`save_pretrained` of the (unwrapped) PEFT model into `out`, recording `base_model` as its base."""
    for adapter_config in peft_model.peft_config.values():
        adapter_config.base_model_name_or_path = base_model
    out.mkdir(parents=True, exist_ok=True)
    # Trained embeddings are saved as `lora_modules_to_save` copies; "auto" would also look the base model
    # up on the hub to decide whether to save the embedding layers.
    peft_model.save_pretrained(str(out), save_embedding_layers=False)


def save_checkpoint(
    path: Path, peft_model: Any, snapshot: Snapshot, state: TrainerState, base_model: str
) -> Path:
    """Write a checkpoint of `snapshot` (the live `peft_model`'s adapter, saved as a loadable PEFT adapter)
    into `path` atomically, replacing an older one of the same name; return `path`. `state` goes into
    trainer_state.json, written last."""
    import torch

    partial = path.parent / f".{path.name}.partial-{os.getpid()}"  # never matches CHECKPOINT_NAME
    shutil.rmtree(partial, ignore_errors=True)
    save_adapter(peft_model, partial, base_model)
    torch.save(snapshot.optimizer, partial / OPTIMIZER_FILE)
    torch.save(snapshot.scheduler, partial / SCHEDULER_FILE)
    if snapshot.rng is not None:
        torch.save(snapshot.rng, partial / RNG_FILE)
    (partial / STATE_FILE).write_text(json.dumps(dict(state), indent=2) + "\n", encoding="utf-8")
    if path.exists():  # rename() does not replace a directory: move the old one aside first
        old = path.parent / f".{path.name}.old-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        path.rename(old)
        partial.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        partial.rename(path)
    return path


def read_state(path: Path) -> TrainerState:
    """A checkpoint's trainer_state.json (ValueError when it is not a JSON object with a global_step)."""
    state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        raise ValueError(f"{path / STATE_FILE}: no global_step")
    return cast(TrainerState, state)  # as save_checkpoint wrote it: only global_step is checked


def is_complete(path: Path) -> bool:
    """Whether `path` is a whole checkpoint: every file there and a readable state."""
    if not all((path / name).is_file() for name in CHECKPOINT_FILES):
        return False
    try:
        read_state(path)
    except (OSError, ValueError):
        return False
    return True


def latest_checkpoint(root: Path) -> Path | None:
    """The complete `step-N` directory under `root` with the highest N (None when there is none)."""
    if not root.is_dir():
        return None
    found = [
        (int(match.group(1)), entry)
        for entry in root.iterdir()
        if (match := CHECKPOINT_NAME.fullmatch(entry.name)) and entry.is_dir() and is_complete(entry)
    ]
    return max(found)[1] if found else None


def prune_checkpoints(current: Path, limit: int) -> list[Path]:
    """Delete the `step-N` directories beside `current` (the checkpoint just written) beyond the newest
    `limit` complete ones (`save_total_limit`), and return them. `current` itself stays, whatever `limit`:
    it is the rollback anchor's copy and what a resume starts from; so does any with a higher N (a run that
    resumed from an older checkpoint never deletes a newer one). Each goes out of its name first, so a crash
    mid-delete leaves no `step-N` that is only part of one."""
    match = CHECKPOINT_NAME.fullmatch(current.name)
    if match is None:
        raise ValueError(f"{current}: not a step-N checkpoint directory")
    step = int(match.group(1))
    numbered = [(CHECKPOINT_NAME.fullmatch(entry.name), entry) for entry in current.parent.iterdir()]
    older = sorted(
        (
            (int(m.group(1)), entry)
            for m, entry in numbered
            if m and entry.is_dir() and int(m.group(1)) < step
        ),
        reverse=True,
    )
    kept, deleted = 1, []
    for _, entry in older:
        if kept < limit and is_complete(entry):
            kept += 1
            continue
        doomed = entry.parent / f".{entry.name}.old-{os.getpid()}"
        shutil.rmtree(doomed, ignore_errors=True)
        entry.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        deleted.append(entry)
    return deleted


def load_checkpoint(path: Path) -> Snapshot:
    """A complete checkpoint directory read back (onto the CPU) as a Snapshot."""
    import torch
    from safetensors.torch import load_file

    rng_path = path / RNG_FILE
    return Snapshot(
        position=Position.from_state(read_state(path)),
        adapter=load_file(str(path / ADAPTER_FILE)),
        optimizer=torch.load(path / OPTIMIZER_FILE, map_location="cpu", weights_only=True),
        scheduler=torch.load(path / SCHEDULER_FILE, weights_only=True),
        rng=torch.load(rng_path, weights_only=True) if rng_path.is_file() else None,
    )


def write_results(
    out: Path,
    *,
    peft_model: Any,
    tokenizer: Any,
    config: TrainConfig,
    metrics: Metrics,
    run_id: str,
    target_modules: Sequence[str],
    job_yaml: str | None = None,
    wandb_url: str | None = None,
) -> None:
    """Write the adapter, tokenizer, metrics.json and README.md into `out` (created if missing).

    The card is written last, over the README.md that PEFT's `save_pretrained` leaves behind.
    """
    out.mkdir(parents=True, exist_ok=True)
    save_adapter(peft_model, out, config.base_model)
    tokenizer.save_pretrained(str(out))
    (out / METRICS_FILE).write_text(json.dumps(dict(metrics), indent=2) + "\n", encoding="utf-8")
    text = card.render(
        config, metrics, run_id=run_id, target_modules=target_modules, job_yaml=job_yaml, wandb_url=wandb_url
    )
    card.write(out / "README.md", text)
