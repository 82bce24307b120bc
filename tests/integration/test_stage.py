"""The shape every stage task shares (workers.runner.run_stage), against a real Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery.exceptions import Retry

from core.errors import FailureReason, NodeError, ProviderUnavailable, StageFailed
from core.settings import Settings
from state.models import Run
from state.stages import RunState, Stage
from workers import context
from workers.runner import run_stage
from workers.stage import Next


@pytest.fixture
def ctx(redis_client: redis.Redis[str], redis_url: str, fleet_home: Path) -> Iterator[context.Context]:
    from broker.app import configure

    settings = Settings(home=fleet_home)
    configure(settings, redis_url)
    yield context.init(settings, redis_url)


def task(task_id: str = "t1", retries: int = 0, max_retries: int = 3) -> Any:
    def retry(exc: Exception, countdown: float) -> Retry:
        return Retry(exc=exc, when=countdown)

    request = SimpleNamespace(id=task_id, retries=retries)
    return SimpleNamespace(request=request, max_retries=max_retries, retry=retry)


def queued_run(ctx: context.Context, state: RunState, **kw: Any) -> Run:
    spec = {
        "train": {"base_model": "m", "datasets": [{"path": "/d.jsonl"}]},
        "provider": "local",
        "section": {},
    }
    run = Run(
        run_id="r1",
        provider="local",
        source="t",
        spec=spec,
        run_dir="/r",
        output_dir="/r/o",
        state=state,
        **kw,
    )
    return ctx.ledger.create_run(run, [])


def failing(exc: Exception) -> Any:
    def step(_ctx: context.Context, _run: Run) -> Next:
        raise exc

    return step


def test_a_retryable_error_is_retried_until_the_limit_then_fails_the_run(ctx: context.Context) -> None:
    queued_run(ctx, RunState.TRAINING)
    for retries in range(3):  # the run counts its failures (Run.retrying): a kicked task's count goes on
        with pytest.raises(Retry):
            run_stage(task(retries=retries), "r1", Stage.TRAIN, failing(NodeError("head not answering")))
        assert ctx.ledger.get_run("r1").state == RunState.TRAINING
    run_stage(task(retries=3), "r1", Stage.TRAIN, failing(NodeError("head not answering")))
    run = ctx.ledger.get_run("r1")
    assert run.state == RunState.FAILED and run.failure_reason == FailureReason.TRAINING_FAILED
    assert run.failure_message == "gave up after 4 failures in 0 s: head not answering"


def test_a_provider_that_says_when_is_retried_then(ctx: context.Context) -> None:
    queued_run(ctx, RunState.PROVISIONING)
    asked: list[float] = []

    def retry(exc: Exception, countdown: float) -> Retry:
        asked.append(countdown)
        return Retry(exc=exc, when=countdown)

    busy = task()
    busy.retry = retry
    with pytest.raises(Retry):
        run_stage(busy, "r1", Stage.PROVISION, failing(ProviderUnavailable("quota", retry_after=42)))
    with pytest.raises(Retry):
        run_stage(busy, "r1", Stage.PROVISION, failing(ProviderUnavailable("quota", retry_after=86400)))
    with pytest.raises(Retry):  # no word on when: Celery's own jittered back-off
        run_stage(busy, "r1", Stage.PROVISION, failing(ProviderUnavailable("down")))
    assert asked[:2] == [42, 600] and 0 <= asked[2] <= 4  # honoured, up to ten minutes
    assert ctx.ledger.get_run("r1").state == RunState.PROVISIONING


def test_stage_failed_carries_its_reason(ctx: context.Context) -> None:
    queued_run(ctx, RunState.PREPARING)
    run_stage(task(), "r1", Stage.PREPARE, failing(StageFailed(FailureReason.INSTANCE_LOST, "gone")))
    run = ctx.ledger.get_run("r1")
    assert (run.state, run.failure_reason, run.failure_message) == (
        RunState.FAILED,
        FailureReason.INSTANCE_LOST,
        "gone",
    )


def test_a_bug_in_a_step_fails_the_run_instead_of_leaving_it(ctx: context.Context) -> None:
    queued_run(ctx, RunState.PREPARING)
    run_stage(task(), "r1", Stage.PREPARE, failing(KeyError("oops")))
    assert ctx.ledger.get_run("r1").failure_reason == FailureReason.INTERNAL_ERROR


def test_a_stale_message_hands_the_run_to_its_current_stage(ctx: context.Context) -> None:
    queued_run(ctx, RunState.PREPARING)
    run_stage(task(), "r1", Stage.TRAIN, failing(AssertionError("the train step must not run")))
    assert ctx.redis.llen(Stage.PREPARE.value) == 1 and ctx.redis.llen(Stage.TRAIN.value) == 0


def test_cancel_is_seen_before_the_step(ctx: context.Context) -> None:
    queued_run(ctx, RunState.TRAINING, cancel_requested=True)
    run_stage(task(), "r1", Stage.TRAIN, failing(AssertionError("the step must not run")))
    run = ctx.ledger.get_run("r1")
    assert run.state == RunState.CANCELLED and run.failure_reason == FailureReason.CANCELLED_BY_USER


def test_a_task_that_does_not_own_the_run_stands_down(ctx: context.Context) -> None:
    queued_run(ctx, RunState.TRAINING)
    assert ctx.dispatcher.claim("r1", "owner")
    run_stage(task("intruder"), "r1", Stage.TRAIN, failing(AssertionError("must not run")))
    assert ctx.ledger.get_run("r1").state == RunState.TRAINING


def test_a_run_whose_nodes_cost_its_cap_is_stopped(
    redis_client: redis.Redis[str], redis_url: str, fleet_home: Path
) -> None:
    """FLEET_MAX_DOLLARS_PER_RUN: a stage task that finds the run's nodes at the cap fails it OVER_BUDGET,
    with the figure, before its step runs; below the cap the step runs."""
    import time

    from broker.app import configure
    from state.models import Instance, InstanceState

    settings = Settings(home=fleet_home, max_dollars_per_run=5.0)
    configure(settings, redis_url)
    ctx = context.init(settings, redis_url)
    run = queued_run(ctx, RunState.TRAINING, instance="tf-r1-1")
    hour_ago = time.time() - 3600
    node = Instance(name="tf-r1-1", provider="local", run_id="r1", state=InstanceState.RUNNING)
    ctx.ledger.put_instance(node.model_copy(update={"price_per_hour": 4.0, "created_at": hour_ago}))
    ran: list[str] = []

    def step(_ctx: context.Context, _run: Run) -> Next:
        ran.append(_run.run_id)
        return Next.done()

    run_stage(task(), "r1", Stage.TRAIN, step)
    assert ran == ["r1"]  # $4 of $5
    ctx.ledger.update_instance("tf-r1-1", price_per_hour=6.0)
    run_stage(task(), "r1", Stage.TRAIN, step)
    run = ctx.ledger.get_run("r1")
    assert ran == ["r1"] and run.state == RunState.FAILED and run.failure_reason == FailureReason.OVER_BUDGET
    assert run.failure_message == "its nodes cost $6.00; the cap is $5.00 a run (FLEET_MAX_DOLLARS_PER_RUN)"
