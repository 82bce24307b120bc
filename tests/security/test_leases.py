"""Finding 9 (issue 19): a stage's claim on a run is a lease, renewed while its step runs and fenced.

A step longer than `stall_after_s` keeps its run: the reaper finds an owner and sends no second task. A task
whose claim was taken over (it stalled past the TTL, and another task owns the run now) has its ledger
writes to the run refused, and stands down: no teardown, no hand-over. Writes from outside a stage task are
not fenced. The stage task body is the fleet's own (`workers.runner.run_stage`, as Celery calls it) against a
real Redis; the reaper is the real `reap_once`, in a thread of its own as it would be in its own process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from core.errors import FailureReason, LeaseLost, ProviderUnavailable, StageFailed
from core.settings import Settings
from state.keys import tick_key
from state.models import Instance, InstanceState, Run
from state.stages import RunState, Stage
from workers import context
from workers.runner import run_stage
from workers.stage import Next
from workers.stages.reap import Report, reap_once

pytestmark = pytest.mark.integration

STALL_S = 0.6  # stall_after_s: the claim's TTL
RUN = "r1"


@pytest.fixture
def ctx(redis_client: redis.Redis[str], redis_url: str, fleet_home: Path) -> Iterator[context.Context]:
    from broker.app import configure

    settings = Settings(home=fleet_home, stall_after_s=STALL_S, orphan_grace_s=0)
    configure(settings, redis_url)
    yield context.init(settings, redis_url)


def task(task_id: str = "t1") -> Any:
    """The part of a bound Celery task that run_stage reads."""
    return SimpleNamespace(request=SimpleNamespace(id=task_id, retries=0), max_retries=3)


def training_run(ctx: context.Context, **kw: Any) -> Run:
    spec = {
        "train": {"base_model": "m", "datasets": [{"path": "/d.jsonl"}]},
        "provider": "local",
        "section": {},
    }
    run = Run(
        run_id=RUN,
        provider="local",
        source="t",
        spec=spec,
        run_dir="/r",
        output_dir="/r/o",
        state=RunState.TRAINING,
        **kw,
    )
    return ctx.ledger.create_run(run, [])


def queued_tasks(ctx: context.Context) -> int:
    return sum(int(ctx.redis.llen(stage.value)) for stage in Stage)


def lease_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("lease:") and "tick" in t.name]


def test_a_step_longer_than_stall_after_keeps_its_claim_and_the_reaper_sends_no_second_task(
    ctx: context.Context,
) -> None:
    training_run(ctx)
    seen: dict[str, Any] = {}
    started, reaped = threading.Event(), threading.Event()

    def reaper() -> None:  # another process's reaper pass, while the step is deep in a long upload
        started.wait(10)
        time.sleep(STALL_S * 4)
        seen["report"] = reap_once(ctx)
        seen["owner"] = ctx.dispatcher.owner(RUN)
        seen["queued"] = queued_tasks(ctx)
        reaped.set()

    def long_step(c: context.Context, _run: Run) -> Next:
        started.set()
        assert reaped.wait(15), "the reaper pass did not run"
        return Next.poll(Stage.TRAIN, 0)

    thread = threading.Thread(target=reaper)
    thread.start()
    began = time.monotonic()
    run_stage(task("t1"), RUN, Stage.TRAIN, long_step)
    thread.join(5)

    assert time.monotonic() - began > STALL_S * 4  # the step did outlast its claim's TTL several times
    report: Report = seen["report"]
    assert report.kicked == [], "the reaper re-sent the stage of a run whose task was still working"
    assert seen["owner"] == "t1" and seen["queued"] == 0
    assert queued_tasks(ctx) == 1  # then the task handed the run on, once
    assert lease_threads() == []  # its renewer stopped with the step


def test_a_task_whose_claim_was_taken_over_has_its_write_refused_and_stands_down(
    ctx: context.Context, caplog: pytest.LogCaptureFixture
) -> None:
    training_run(ctx)
    refused: list[LeaseLost] = []

    def usurped(c: context.Context, _run: Run) -> Next:
        # The task stalled past its TTL; the reaper re-sent the stage and that task claimed the run.
        c.redis.set(tick_key(RUN), "usurper", px=60_000)

        def note(r: Run) -> None:
            r.log_offset = 99

        try:
            c.ledger.update_run(RUN, note)
        except LeaseLost as exc:
            refused.append(exc)
            raise
        return Next.poll(Stage.TRAIN, 0)

    run_stage(task("t1"), RUN, Stage.TRAIN, usurped)

    run = ctx.ledger.get_run(RUN)
    assert run.log_offset == 0, "a task that lost its claim wrote the run"
    assert refused and "t1" in str(refused[0]) and "usurper" in str(refused[0])
    assert run.state == RunState.TRAINING and run.failure_reason is None  # no teardown
    assert ctx.dispatcher.owner(RUN) == "usurper" and queued_tasks(ctx) == 0  # no hand-over either
    assert "stands down" in caplog.text


def test_a_task_that_lost_its_claim_and_then_fails_does_not_tear_the_run_down(
    ctx: context.Context, caplog: pytest.LogCaptureFixture
) -> None:
    """The new owner's node stays up and its Ray job runs on: the old task's teardown is refused before it
    stops the run's Ray jobs (here it would try, and log that the node cannot be reached) or terminates."""
    training_run(ctx, instance="tf-r1-1", ray_jobs={"train": "raysubmit_new_owners"})
    ctx.ledger.put_instance(
        Instance(name="tf-r1-1", provider="local", run_id=RUN, state=InstanceState.RUNNING)
    )

    def fails_late(c: context.Context, _run: Run) -> Next:
        c.redis.set(tick_key(RUN), "usurper", px=60_000)
        raise StageFailed(FailureReason.TRAINING_FAILED, "the job failed (as seen by a stale task)")

    run_stage(task("t1"), RUN, Stage.TRAIN, fails_late)

    assert "could not stop its Ray jobs" not in caplog.text  # it never tried
    run = ctx.ledger.get_run(RUN)
    assert run.state == RunState.TRAINING and run.failure_reason is None
    record = ctx.ledger.get_instance("tf-r1-1")
    assert record is not None and record.state == InstanceState.RUNNING


def test_writes_from_outside_a_stage_task_are_not_fenced(ctx: context.Context) -> None:
    """A cancel from the CLI (another thread, as another process) lands while a stage task holds the run,
    and the task's own write goes through too: the fence refuses only a task that lost its claim."""
    training_run(ctx)

    def step(c: context.Context, _run: Run) -> Next:
        def cancel(r: Run) -> None:
            r.cancel_requested = True

        outside = threading.Thread(target=lambda: c.ledger.update_run(RUN, cancel))
        outside.start()
        outside.join(5)

        def note(r: Run) -> None:
            r.log_offset = 7

        c.ledger.update_run(RUN, note)
        return Next.done()

    run_stage(task("t1"), RUN, Stage.TRAIN, step)
    run = ctx.ledger.get_run(RUN)
    assert run.cancel_requested and run.log_offset == 7


class Retried(Exception):
    """What the fake task's `retry` returns (Celery's raises Retry): the countdown it was asked for."""

    def __init__(self, countdown: float) -> None:
        super().__init__(countdown)
        self.countdown = countdown


def test_a_task_that_retries_later_than_stall_after_keeps_its_claim_through_the_wait(
    ctx: context.Context,
) -> None:
    training_run(ctx)
    wait_s = STALL_S * 5  # the provider said "try again in 3 s": longer than the claim's TTL

    def busy(_c: context.Context, _run: Run) -> Next:
        raise ProviderUnavailable("rate limited", retry_after=wait_s)

    retrying = task("t1")
    retrying.retry = lambda exc, countdown: Retried(countdown)
    with pytest.raises(Retried) as raised:
        run_stage(retrying, RUN, Stage.TRAIN, busy)
    assert raised.value.countdown == pytest.approx(wait_s)

    time.sleep(STALL_S * 2)  # the claim's TTL passes while the retry waits in the broker
    report = reap_once(ctx)
    assert report.kicked == [], "the reaper re-sent a run whose own task is waiting to try again"
    assert ctx.dispatcher.owner(RUN) == "t1" and queued_tasks(ctx) == 0
    assert int(ctx.redis.pttl(tick_key(RUN))) > 0  # and the claim does lapse once the retry is due
