"""The loss watchdog: when training breaks, go back to the last good state with half the learning rate.

It trips on (axolotl's keys, but a rollback where axolotl aborts):

- a non-finite step: the total norm of the gradients is NaN or infinite. Every rank sees the same norm (DDP
  has averaged the gradients before it is taken), and a rank whose own loss is not finite multiplies it by
  NaN before the backward pass, so its gradients, and therefore everyone's average, are NaN too. All ranks
  decide alike without a collective of their own; the step is not applied.
- `loss_watchdog_threshold`: the logged loss (a STEP line's, already the mean over all workers) above it
  for `loss_watchdog_patience` logged steps in a row.

A trip rolls back to the run's anchor snapshot (its last checkpoint, else the state it started from) and
halves the learning rate again (the scheduler's base rates and the optimizer's current ones). After
`loss_watchdog_max_rollbacks` rollbacks, the next trip fails the run with TrainingFailed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from trainer.config import TrainConfig
from trainer.errors import TrainingFailed

LR_FACTOR = 0.5  # what each rollback multiplies the learning rate by


class Reason(StrEnum):
    """Why the watchdog rolled back (a ROLLBACK line's `reason`)."""

    NON_FINITE = "non_finite"  # the loss, or the gradients, of one step were NaN or infinite
    HIGH_LOSS = "high_loss"  # the logged loss stayed above loss_watchdog_threshold for `patience` lines


@dataclass(frozen=True)
class Trip:
    """One time the watchdog went off: why, at which step, and the value that set it off."""

    reason: Reason
    step: int
    loss: float  # this worker's loss (NON_FINITE: may be finite when another worker's was not)
    grad_norm: float | None = None

    def describe(self, threshold: float | None, patience: int) -> str:
        if self.reason == Reason.HIGH_LOSS:
            return (
                f"loss was above loss_watchdog_threshold {threshold} for {patience} logged steps in a row "
                f"({self.loss:.6g} at step {self.step})"
            )
        if not math.isfinite(self.loss):
            return f"loss was {self.loss} at step {self.step}"
        return f"gradient norm was {self.grad_norm} at step {self.step} (a worker's loss was not finite)"


class Watchdog:
    """Decides when to roll back, and when rolling back has been tried often enough."""

    def __init__(self, threshold: float | None, patience: int, max_rollbacks: int) -> None:
        self.threshold, self.patience, self.max_rollbacks = threshold, patience, max_rollbacks
        self.high_streak = 0  # logged steps in a row above the threshold

    @classmethod
    def from_config(cls, config: TrainConfig) -> Watchdog:
        return cls(
            config.loss_watchdog_threshold, config.loss_watchdog_patience, config.loss_watchdog_max_rollbacks
        )

    def non_finite(self, step: int, loss: float, grad_norm: float) -> Trip:
        return Trip(Reason.NON_FINITE, step, loss, grad_norm)

    def logged(self, step: int, loss: float) -> Trip | None:
        """Note a logged loss; a Trip once `patience` of them in a row were above the threshold."""
        if self.threshold is None or loss <= self.threshold:
            self.high_streak = 0
            return None
        self.high_streak += 1
        return Trip(Reason.HIGH_LOSS, step, loss) if self.high_streak >= self.patience else None

    def allow(self, trip: Trip, rollbacks: int) -> None:
        """Let a rollback happen after `rollbacks` earlier ones, or raise TrainingFailed (with the reason)."""
        self.high_streak = 0
        if rollbacks >= self.max_rollbacks:
            plural = "" if rollbacks == 1 else "s"
            raise TrainingFailed(
                f"{trip.describe(self.threshold, self.patience)} after {rollbacks} rollback{plural} "
                f"(loss_watchdog_max_rollbacks: {self.max_rollbacks})"
            )


def scale_learning_rate(optimizer: Any, scheduler: Any, factor: float) -> None:
    """Multiply the learning rate by `factor`, now and for the rest of the schedule."""
    for group in optimizer.param_groups:
        group["lr"] *= factor
        if "initial_lr" in group:
            group["initial_lr"] *= factor
    scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]
    scheduler._last_lr = [lr * factor for lr in scheduler.get_last_lr()]
