"""The shape of a stage: what a step returns (`Next`), the stages' order, entering a stage, and the retry
policy every stage task shares.

A step is a plain function `step(ctx, run) -> Next`. It never waits long: to wait, it returns
`Next.poll()` and the same stage's task is sent again after a short countdown; when its stage is done it
returns `Next.onward(stage)`, and the run goes to the stage after it (broker.constants.Stage.following).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TypedDict

from broker.constants import Stage
from broker.ledger import Draft
from broker.models import STATE_OF_STAGE, Run, RunState
from broker.payloads import StageFinished, StageStarted
from core.errors import RETRYABLE

# Every stage task: retry only what can get better by itself, with jittered exponential back-off.
MAX_RETRY_AFTER_S = 600.0  # a provider's Retry-After is honoured up to this


class RetryPolicy(TypedDict):
    """The retry options of a Celery task (its decorator's keyword arguments)."""

    autoretry_for: tuple[type[Exception], ...]
    retry_backoff: int
    retry_backoff_max: int
    retry_jitter: bool
    max_retries: int


RETRY_POLICY = RetryPolicy(
    autoretry_for=RETRYABLE, retry_backoff=1, retry_backoff_max=60, retry_jitter=True, max_retries=12
)


@dataclass(frozen=True)
class Next:
    """What a step wants next: poll this stage again, move to another stage, or nothing."""

    stage: Stage | None
    countdown: float = 0.0

    @staticmethod
    def poll(stage: Stage, countdown: float) -> Next:
        return Next(stage, countdown)

    @staticmethod
    def onward(done: Stage) -> Next:
        """`done` is finished: the run goes on to the stage after it."""
        return Next(done.following, 0.0)

    @staticmethod
    def done() -> Next:
        return Next(None)


def enter_next(run: Run, done: Stage) -> list[Draft]:
    """Move a run from `done` into the stage after it (see `enter`)."""
    return enter(run, done.following)


def enter(run: Run, stage: Stage) -> list[Draft]:
    """Move a run into `stage` (closing the one it was in); returns the events that says."""
    drafts: list[Draft] = []
    now = time.time()
    previous = run.state.stage if run.state != RunState.QUEUED else None
    if previous is not None:
        timing = run.stage(previous)
        if timing.ended is None:
            timing.ended = now
            drafts.append(StageFinished(stage=previous, seconds=timing.seconds))
    run.state = STATE_OF_STAGE[stage]
    run.stage(stage).started = now
    drafts.append(StageStarted(stage=stage))
    return drafts
