"""What a run can go back to: a Snapshot of the LoRA weights, optimizer, scheduler, RNGs and loop position.

The loss watchdog rolls back to one kept in memory (taken at the start and at every checkpoint; the LoRA
part of a model and its optimizer state are small), and a resumed run starts from one read back from a
checkpoint directory (trainer.outputs). Every worker holds its own copy: under DDP the weights, optimizer
and scheduler are the same on every rank, so restoring needs no collective.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from trainer.errors import TrainingFailed

if TYPE_CHECKING:
    from torch import Tensor


class PositionState(TypedDict):
    """A Position as trainer_state.json holds it (this key order). Checkpoints of older versions may lack
    any key but `global_step`; `Position.from_state` gives those their defaults."""

    epoch: NotRequired[float]
    epoch_index: NotRequired[int]
    batches_done: NotRequired[int]
    train_loss_sum: NotRequired[float]
    eval_loss_first: NotRequired[float | None]
    eval_loss: NotRequired[float | None]
    lr_scale: NotRequired[float]
    rollbacks: NotRequired[int]
    global_step: int


class RngState(TypedDict):
    """The RNG states `rng_state` takes (rng_state.pt holds this dict)."""

    torch: Tensor  # torch's CPU generator
    python: tuple[Any, ...]  # random.getstate()
    cuda: NotRequired[Tensor]  # the device's generator, on CUDA only


@dataclass
class Position:
    """Where the loop stands; trainer_state.json holds it (`step` as `global_step`)."""

    step: int = 0  # optimizer steps done
    epoch: float = 0.0  # epochs done, fractional (what STEP lines show)
    epoch_index: int = 0  # the epoch being trained: the sampler's epoch
    batches_done: int = 0  # micro batches of that epoch this worker has consumed
    train_loss_sum: float = 0.0  # sum of the step losses so far
    eval_loss_first: float | None = None
    eval_loss: float | None = None  # the latest evaluation
    lr_scale: float = 1.0  # the watchdog's halvings of the learning rate so far, multiplied
    rollbacks: int = 0

    def normalized(self, batches_per_epoch: int) -> Position:
        """This position with a finished epoch turned into the start of the next one."""
        if self.batches_done < batches_per_epoch:
            return dataclasses.replace(self)
        return dataclasses.replace(self, epoch_index=self.epoch_index + 1, batches_done=0)

    def to_state(self) -> PositionState:
        return PositionState(
            epoch=self.epoch,
            epoch_index=self.epoch_index,
            batches_done=self.batches_done,
            train_loss_sum=self.train_loss_sum,
            eval_loss_first=self.eval_loss_first,
            eval_loss=self.eval_loss,
            lr_scale=self.lr_scale,
            rollbacks=self.rollbacks,
            global_step=self.step,
        )

    @classmethod
    def from_state(cls, state: PositionState) -> Position:
        """The position in a trainer_state.json (keys it does not know are ignored, missing ones default)."""
        default = cls()
        return cls(
            step=int(state["global_step"]),
            epoch=state.get("epoch", default.epoch),
            epoch_index=state.get("epoch_index", default.epoch_index),
            batches_done=state.get("batches_done", default.batches_done),
            train_loss_sum=state.get("train_loss_sum", default.train_loss_sum),
            eval_loss_first=state.get("eval_loss_first", default.eval_loss_first),
            eval_loss=state.get("eval_loss", default.eval_loss),
            lr_scale=state.get("lr_scale", default.lr_scale),
            rollbacks=state.get("rollbacks", default.rollbacks),
        )


@dataclass(frozen=True)
class Snapshot:
    """Copies, on the CPU, of everything a run needs to continue from `position`."""

    position: Position
    adapter: dict[str, Tensor]  # the PEFT adapter state dict (get_peft_model_state_dict's keys)
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    rng: RngState | None  # None: a checkpoint without RNG states (the RNGs are left as they are)


def capture(peft_model: Any, optimizer: Any, scheduler: Any, position: Position, device: Any) -> Snapshot:
    """A snapshot of the live run (deep copies: training on does not change it)."""
    from peft import get_peft_model_state_dict

    adapter = get_peft_model_state_dict(peft_model, save_embedding_layers=False)
    return Snapshot(
        position=dataclasses.replace(position),
        adapter=cpu_copy(adapter),
        optimizer=cpu_copy(optimizer.state_dict()),
        scheduler=copy.deepcopy(scheduler.state_dict()),
        rng=rng_state(device),
    )


def restore(snapshot: Snapshot, peft_model: Any, optimizer: Any, scheduler: Any, device: Any) -> Position:
    """Put `snapshot` back into the live objects (weights copied in place, so DDP and the optimizer keep
    their parameters) and return a copy of its position. The snapshot stays as it was."""
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(peft_model, snapshot.adapter)
    missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k]
    if missing:
        raise TrainingFailed(f"the checkpoint does not fit this model: it lacks {', '.join(missing[:3])}")
    # load_state_dict keeps tensors already on the right device: give it copies it may update in place.
    optimizer.load_state_dict(cpu_copy(snapshot.optimizer))
    scheduler.load_state_dict(copy.deepcopy(snapshot.scheduler))
    if snapshot.rng is not None:
        set_rng_state(snapshot.rng, device)
    return dataclasses.replace(snapshot.position)


def cpu_copy(obj: Any) -> Any:
    """`obj` with every tensor in it copied to the CPU and every container rebuilt."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(cpu_copy(v) for v in obj)
    return copy.deepcopy(obj)


def rng_state(device: Any) -> RngState:
    """The RNG states training draws from: torch's CPU generator, the device's (CUDA), Python's."""
    import torch

    state: RngState = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if getattr(device, "type", "cpu") == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: RngState, device: Any) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and getattr(device, "type", "cpu") == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
