"""auto_find_batch_size: the largest micro batch that fits, found with trial steps before training.

The search starts at `micro_batch_size`. While a trial forward+backward on the longest examples fits, the
size doubles, up to MAX_GROWTH times the configured one and never past a worker's share of the data; when
the configured size itself does not fit, it halves down to 1 (and fails the run if even 1 does not fit).
Every rank runs each trial and they agree on its outcome (one collective per trial), so all use one size.
The trials run with the RNG states forked, and leave no gradients behind.

The effective batch (micro batch x gradient_accumulation_steps x workers) stays as configured where it can:
accumulation becomes ceil(configured micro batch x accumulation / chosen micro batch), at least 1. A larger
micro batch with an accumulation of 1 therefore makes a larger effective batch (and fewer steps per epoch).

Out of memory: torch.cuda.OutOfMemoryError, MemoryError, or a RuntimeError that says so (the CPU
allocator's "can't allocate memory"). A CPU has no allocator limit a test can rely on, so the fault
`memory_cap_mb` (trainer.faults) makes a trial fail when the activations autograd saves for the backward
pass (counted by a saved_tensors_hooks pair: each storage once, parameters left out) exceed the cap. That
count depends only on the model and the batch's shape: deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer import lines
from trainer.errors import TrainingFailed

if TYPE_CHECKING:
    import torch

MAX_GROWTH = 8  # the search never goes past this many times the configured micro batch
OOM_MESSAGES = ("out of memory", "can't allocate memory")


class SimulatedOOM(MemoryError):
    """A trial went over the `memory_cap_mb` test hook's cap."""


@dataclass(frozen=True)
class Trial:
    """One trial step: the micro batch size tried, and whether it fitted (on every worker)."""

    size: int
    fits: bool


@dataclass(frozen=True)
class Choice:
    """What the search settled on (a resumed run: what its checkpoint used, nothing tried)."""

    micro_batch_size: int
    gradient_accumulation_steps: int
    tried: list[Trial]

    @classmethod
    def of_checkpoint(cls, state: Mapping[str, Any]) -> Choice | None:
        """The sizes a checkpoint's trainer_state.json records (None when it does not)."""
        if "micro_batch_size" not in state or "gradient_accumulation_steps" not in state:
            return None
        return cls(int(state["micro_batch_size"]), int(state["gradient_accumulation_steps"]), [])

    def config_update(self) -> dict[str, int]:
        return {
            "micro_batch_size": self.micro_batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
        }

    def line(self) -> lines.BatchSize:
        """The BATCH_SIZE line that says it."""
        return lines.BatchSize(
            micro_batch_size=self.micro_batch_size,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            tried=[lines.Trial(size=t.size, fits=t.fits) for t in self.tried],
        )


def search(start: int, limit: int, fits: Callable[[int], bool]) -> tuple[int, list[Trial]]:
    """The largest size that `fits`: doubling from `start` while it fits (not past `limit`), or halving
    from it down to 1 when `start` does not. TrainingFailed when not even 1 fits."""
    tried: list[Trial] = []

    def attempt(size: int) -> bool:
        tried.append(Trial(size, fits(size)))
        return tried[-1].fits

    size = start
    if attempt(size):
        while size * 2 <= limit and attempt(size * 2):
            size *= 2
        return size, tried
    while size > 1:
        size //= 2
        if attempt(size):
            return size, tried
    raise TrainingFailed(
        "auto_find_batch_size: out of memory even with micro_batch_size 1 "
        f"(tried {', '.join(str(t.size) for t in tried)})"
    )


def accumulation_for(micro_batch_size: int, gradient_accumulation_steps: int, chosen: int) -> int:
    """The accumulation that keeps the configured effective batch with a micro batch of `chosen`."""
    return max(1, math.ceil(micro_batch_size * gradient_accumulation_steps / chosen))


def is_oom(exc: BaseException) -> bool:
    """Whether `exc` says the device (or the host) ran out of memory."""
    import torch

    if isinstance(exc, MemoryError | torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in OOM_MESSAGES)


class ActivationMeter:
    """Counts the bytes of the tensors autograd saves for the backward pass (each storage once, parameters
    and buffers not counted): use `hooks()` as a context manager around a forward pass."""

    def __init__(self, model: Any) -> None:
        self.skip = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
        self.seen: set[int] = set()
        self.bytes = 0

    def pack(self, tensor: Any) -> Any:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in self.skip and key not in self.seen:
            self.seen.add(key)
            self.bytes += storage.nbytes()
        return tensor

    @staticmethod
    def unpack(tensor: Any) -> Any:
        return tensor

    def hooks(self) -> Any:
        import torch

        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


def trial_step(
    model: Any,
    batch: dict[str, torch.Tensor],
    cap_bytes: int | None,
    autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> None:
    """One forward+backward of `batch` (the forward in `autocast()`, as training runs it); raises an
    out-of-memory error when it does not fit (SimulatedOOM when the activations exceed `cap_bytes`). Leaves
    gradients behind: the caller drops them."""
    meter = ActivationMeter(model)
    with meter.hooks(), autocast():
        loss = model(**batch).loss
    if cap_bytes is not None and meter.bytes > cap_bytes:
        raise SimulatedOOM(f"the trial's activations take {meter.bytes} bytes, over the cap of {cap_bytes}")
    loss.backward()


def fits(
    model: Any,
    batch: dict[str, torch.Tensor],
    cap_bytes: int | None,
    device: Any,
    autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> bool:
    """Whether a trial step of `batch` fits on this worker; errors other than out of memory propagate."""
    import torch

    try:
        trial_step(model, batch, cap_bytes, autocast)
        ok = True
    except (MemoryError, RuntimeError) as exc:
        if not is_oom(exc):
            raise
        ok = False
    finally:
        model.zero_grad(set_to_none=True)
    if not ok and getattr(device, "type", "cpu") == "cuda":
        torch.cuda.empty_cache()  # after the except block: the traceback no longer holds the tensors
    return ok


def find(
    model: Any,
    examples: Sequence[Any],
    collate: Callable[[Sequence[Any]], dict[str, torch.Tensor]],
    *,
    micro_batch_size: int,
    gradient_accumulation_steps: int,
    shard_size: int,
    device: Any,
    cap_bytes: int | None,
    agree: Callable[[bool], bool],
    autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> Choice:
    """Search for the micro batch with trial steps of `model` (the unwrapped one: trials take no part in
    DDP) on the longest `examples`, their forwards in `autocast()` (the run's mixed precision);
    `agree(fits_here)` tells whether a trial fitted on every worker."""
    import torch

    limit = max(micro_batch_size, min(MAX_GROWTH * micro_batch_size, shard_size))
    longest = sorted(examples, key=lambda e: len(e.input_ids), reverse=True)[:limit]

    def try_size(size: int) -> bool:
        batch = {k: v.to(device) for k, v in collate(longest[:size]).items()}
        return agree(fits(model, batch, cap_bytes, device, autocast))

    was_training = model.training
    model.train()
    forked = [device] if getattr(device, "type", "cpu") == "cuda" else []
    with torch.random.fork_rng(devices=forked):
        size, tried = search(micro_batch_size, limit, try_size)
    model.train(was_training)
    return Choice(size, accumulation_for(micro_batch_size, gradient_accumulation_steps, size), tried)
