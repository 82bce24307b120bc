"""The body every stage task shares: claim the run, check it (ended, cancelled, held, over budget, a stale
message), take one step, and hand it on; a step's failure ends the run cleanly, a lost node replaces it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis
from celery.exceptions import SoftTimeLimitExceeded

from broker import sweeps
from broker.app import time_limits
from core.errors import FailureReason, FleetError, LeaseLost, NodeLost, StageFailed, StepTimedOut
from jobs.redact import redact_values
from state.cost import run_cost
from state.models import Run
from state.stages import STAGES, RunState, Stage
from workers import budget, context
from workers.ending import node_lost, replace_node, teardown
from workers.node_job import known_secrets
from workers.stage import Next, plan_retry, started, went_through

if TYPE_CHECKING:
    from collections.abc import Callable

    from celery import Task

log = logging.getLogger("trainfleet.workers")


def run_stage(task: Task, run_id: str, stage: Stage, step: Callable[[context.Context, Run], Next]) -> None:
    """The body of every stage task; when it ends a sweep's child, the sweep gives its slot to the next.
    The task's claim on the run is renewed while it works, and its writes are fenced by it: a task whose
    claim was taken over (LeaseLost) stands down, leaving the run and its nodes to their new owner."""
    task_id = str(task.request.id)
    try:
        with context.get().dispatcher.hold(run_id, task_id):
            _run_stage(task, run_id, stage, step)
    except LeaseLost as exc:
        log.warning("run %s: %s task %s stands down: %s", run_id, stage, task_id, exc)
    finally:
        _after_sweep_child(run_id)


def _after_sweep_child(run_id: str) -> None:
    ctx = context.get()
    try:
        run = ctx.ledger.get_run(run_id)
        if run.sweep_id is not None and run.state.is_terminal():
            sweeps.advance(ctx.ledger, ctx.dispatcher, run.sweep_id)
    except (FleetError, redis.RedisError) as exc:  # the reaper's pass advances the sweep in any case
        log.warning("run %s: could not advance its sweep: %s", run_id, exc)


def _run_stage(task: Task, run_id: str, stage: Stage, step: Callable[[context.Context, Run], Next]) -> None:
    ctx = context.get()
    task_id = str(task.request.id)
    if not ctx.dispatcher.claim(run_id, task_id):
        log.info("run %s: %s task %s stands down (another task owns the run)", run_id, stage, task_id)
        return
    run = ctx.ledger.get_run(run_id)
    if run.state.is_terminal():
        return
    if run.cancel_requested:
        teardown(ctx, run, RunState.CANCELLED, FailureReason.CANCELLED_BY_USER, "cancelled by request")
        return
    if run.held:  # a sweep's child waiting for a slot: its sweep sends provision when it releases it
        log.info("run %s: held by sweep %s; %s task %s stands down", run_id, run.sweep_id, stage, task_id)
        return
    if run.stopping is None and (why := budget.run_over(ctx, run, run_cost(ctx.ledger, run))) is not None:
        budget.stop(ctx, run, why, task_id)  # its checkpoint kept: finalize brings it back first
        return
    current = run.state.stage
    if current is not None and current != stage:
        ctx.dispatcher.send(current, run_id, after=task_id)  # a stale message: hand to the right stage
        return
    started(ctx, run)
    try:
        nxt = step(ctx, run)
    except LeaseLost:
        raise  # another task owns the run now: no teardown, no retry (run_stage logs it)
    except StageFailed as exc:
        teardown(ctx, ctx.ledger.get_run(run_id), RunState.FAILED, exc.reason, str(exc), keep=exc.keep)
        return
    except NodeLost as exc:
        replace_node(ctx, ctx.ledger.get_run(run_id), str(exc), task_id, exc.at_boot)
        return
    except (FleetError, SoftTimeLimitExceeded) as caught:
        # Every error ends somewhere: one that may pass is retried (run.retrying says why) until its bound;
        # any other fails the run at once, with the reason its class names (AUTH_FAILED) or the stage's.
        error = caught if isinstance(caught, FleetError) else _timed_out(ctx, stage)
        if STAGES[stage].on_node and error.retryable and (lost := node_lost(ctx, run)) is not None:
            replace_node(ctx, ctx.ledger.get_run(run_id), lost, task_id)
            return
        why = redact_values(str(error), known_secrets(ctx))  # a vendor's words may echo what it was sent
        if error.retryable:
            plan = plan_retry(ctx, run_id, stage, error, why, task.max_retries)
            if plan.wait_s is not None:  # the same task again (same id, so it still owns the run)
                ctx.dispatcher.wait(run_id, task_id, plan.wait_s)
                raise task.retry(exc=error, countdown=plan.wait_s) from None
            why = plan.gave_up(why)
        teardown(
            ctx, ctx.ledger.get_run(run_id), RunState.FAILED, error.failure or STAGES[stage].failure, why
        )
        return
    except Exception as exc:  # a bug must not leave a node billing: log it, clean up, fail the run
        log.exception("run %s: %s step crashed", run_id, stage)
        teardown(ctx, ctx.ledger.get_run(run_id), RunState.FAILED, FailureReason.INTERNAL_ERROR, repr(exc))
        return
    went_through(ctx, run)
    if nxt.watch is not None and ctx.dispatcher.park(run_id, task_id, nxt.watch):
        return  # the watcher sends the stage's task when what the run waits for comes
    if nxt.stage is not None:
        ctx.dispatcher.send(nxt.stage, run_id, after=task_id, countdown=nxt.countdown)


def _timed_out(ctx: context.Context, stage: Stage) -> StepTimedOut:
    limit, _hard = time_limits(ctx.settings)[stage.task_name]
    return StepTimedOut(f"the {stage.value} step ran past its soft time limit ({limit:g} s)")
