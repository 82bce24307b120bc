"""The shape of a stage: what a step returns (`Next`), the stages' order, entering a stage, and the retry
policy every stage task shares.

A step is a plain function `step(ctx, run) -> Next`. It never waits long: to wait, it returns
`Next.poll()` and the same stage's task is sent again after a short countdown; when its stage is done it
returns `Next.onward(stage)`, and the run goes to the stage after it (state.stages.Stage.following).

A step that raises an error that may pass (`FleetError.retryable`) is tried again after a back-off
(`plan_retry`): each failure is a `run.retrying` event saying why and when, and the streak is bounded by
the task's max_retries and `retry_for_s` from its first failure; the streak (`Run.retrying`) ends when a
step gets through (`went_through`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from celery.utils.time import get_exponential_backoff_interval

from broker.parking import Watch
from core.errors import RETRYABLE, FleetError
from state.ledger import Draft
from state.models import Retrying, Run
from state.payloads import RunRetrying, StageFinished, StageStarted
from state.stages import STAGES, RunState, Stage

if TYPE_CHECKING:
    from workers.context import Context

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
    """What a step wants next: poll this stage again, wait for something (parked: the watcher sends the
    stage's task when it comes; polled when no watcher looks), move to another stage, or nothing."""

    stage: Stage | None
    countdown: float = 0.0
    watch: Watch | None = None

    @staticmethod
    def poll(stage: Stage, countdown: float) -> Next:
        return Next(stage, countdown)

    @staticmethod
    def wait_job(ctx: Context, stage: Stage, job: str, relay: bool = False) -> Next:
        """Until Ray job `job` on the run's head ends (`relay`: its progress lines relayed meanwhile)."""
        watch = Watch(stage=stage, until=time.time() + ctx.settings.park_max_s, job=job, relay=relay)
        return Next(stage, ctx.settings.poll_interval_s, watch)

    @staticmethod
    def wait_nodes(ctx: Context, stage: Stage, nodes: dict[str, str], until: float) -> Next:
        """Until one of the instances' listed states (`nodes`) changes, or `until` at the latest."""
        watch = Watch(stage=stage, until=min(until, time.time() + ctx.settings.park_max_s), nodes=nodes)
        return Next(stage, ctx.settings.poll_interval_s, watch)

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
    run.state = STAGES[stage].state
    run.stage(stage).started = now
    drafts.append(StageStarted(stage=stage))
    return drafts


@dataclass(frozen=True)
class RetryPlan:
    """What a failed step's run does next: try again in `wait_s`, or (None) fail, the bound reached."""

    wait_s: float | None
    failures: int
    since: float

    def gave_up(self, why: str) -> str:
        """The run's failure message once the bound is reached."""
        took = time.time() - self.since
        return f"gave up after {self.failures} failures in {took:.0f} s: {why}"


def backoff_s(failures: int) -> float:
    """Celery's own jittered exponential back-off of RETRY_POLICY, before try `failures` + 1."""
    return float(
        get_exponential_backoff_interval(
            factor=RETRY_POLICY["retry_backoff"],
            retries=max(0, failures - 1),
            maximum=RETRY_POLICY["retry_backoff_max"],
            full_jitter=RETRY_POLICY["retry_jitter"],
        )
    )


def plan_retry(
    ctx: Context, run_id: str, stage: Stage, exc: FleetError, why: str, max_retries: int | None
) -> RetryPlan:
    """A retryable error ended `stage`'s step: record the failure (a `run.retrying` event with `why`, which
    holds no credential) and say when to try again, or that the bound is reached (`max_retries` failures
    after the first, or `retry_for_s` since it)."""
    now = time.time()
    limit = RETRY_POLICY["max_retries"] if max_retries is None else max_retries
    plan = RetryPlan(None, 0, now)

    def record(r: Run) -> list[Draft]:
        nonlocal plan
        streak = r.retrying if r.retrying is not None and r.retrying.stage == stage else None
        since = streak.since if streak is not None else now
        failures = (streak.failures if streak is not None else 0) + 1
        gives_up_at = since + ctx.settings.retry_for_s
        if failures > limit or now >= gives_up_at:
            plan = RetryPlan(None, failures, since)
            return []
        wait = getattr(exc, "retry_after", None)  # the provider said when: that long, not the back-off
        wait = min(float(wait), MAX_RETRY_AFTER_S) if wait is not None else backoff_s(failures)
        wait = round(min(wait, gives_up_at - now), 3)  # the last try comes at the bound, not after it
        plan = RetryPlan(wait, failures, since)
        r.retrying = Retrying(stage=stage, since=since, failures=failures)
        r.kicks = r.kicked_starts = 0  # the task ended in good order: its chain is alive
        retrying = RunRetrying(
            stage=stage,
            attempt=failures,
            max_failures=limit + 1,
            error=type(exc).__name__,
            why=why[-500:],
            retry_in_s=wait,
            gives_up_at=round(gives_up_at, 3),
        )
        return [retrying]

    ctx.ledger.update_run(run_id, record)
    return plan


def started(ctx: Context, run: Run) -> None:
    """A stage task begins work on `run`: after a kick by the reaper, that is counted, so a task that keeps
    dying before it ends a step (killed at its hard time limit, a worker that crashes) fails the run."""
    if run.kicks:

        def count(r: Run) -> list[Draft]:
            r.kicked_starts += 1
            return []

        ctx.ledger.update_run(run.run_id, count)


def went_through(ctx: Context, run: Run) -> None:
    """A step ended in good order: the run's retry streak and kick counts start again from nothing."""
    if run.retrying is not None or run.kicks or run.kicked_starts:

        def reset(r: Run) -> list[Draft]:
            r.retrying, r.kicks, r.kicked_starts = None, 0, 0
            return []

        ctx.ledger.update_run(run.run_id, reset)
