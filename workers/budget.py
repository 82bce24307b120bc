"""The caps while runs go: a queued run starts only if its worst case still fits (`admit`, provision), and a
run whose money is spent is stopped (`enforce`, each reaper pass; the stage tasks check the per-run cap
too, workers.runner).

A run is stopped OVER_BUDGET when its nodes cost the per-run cap, or when the fleet's nodes, or its
submitter's runs, cost their day cap in the last 24 h and it still has a priced node up (what stopping it
saves). Its checkpoint is kept: a run training on a node that does not share the fleet's files (a rented
one, a sandboxed local one) has its train job stopped and goes to finalize, which brings its output
directory back (the adapter and the checkpoints so far: trainer.pack, as for a finished run) before its
nodes are terminated and it fails OVER_BUDGET (finalize.wind_down); on a node that shares them its output
is in the run's directory already. A run whose train job has not started has nothing to keep: it ends at
once. A wind-down that takes longer than a finalize task's limit is cut short by the reaper.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from broker.locks import Lease
from core.errors import FailureReason, FleetError, StageFailed
from state.budget import Ask, Held, held, refusal, spent_text
from state.keys import BUDGET_LOCK
from state.ledger import Draft
from state.models import Run
from state.payloads import submitter_of
from state.stages import RunState, Stage
from state.worstcase import worst_case
from workers import context
from workers.ending import teardown
from workers.node_job import node
from workers.stage import enter

log = logging.getLogger("trainfleet.budget")
ADMIT_LOCK_S = 30.0  # the budget lock's TTL: a check and one ledger write, far less
ADMIT_WAIT_S = 5.0  # a provision task waits this long for the lock, then polls again


def admit(ctx: context.Context, run: Run, start: Callable[[Run], list[Draft]]) -> Run | None:
    """Take a queued run out of the queue with `start` (provision's first change), once its worst case
    fits under the caps beside what was spent and what the runs already started may still cost; raise
    StageFailed(OVER_BUDGET) when it does not, before any node is asked for. One process at a time (a
    lock), so two runs cannot both take the last room under a cap. None: the lock is busy, look again."""
    lease = Lease(ctx.redis, BUDGET_LOCK, ADMIT_LOCK_S)
    if not lease.acquire(wait_s=ADMIT_WAIT_S):
        return None
    try:
        settings = ctx.settings
        worst = worst_case(run.spec, settings.max_dollars_per_run, run.ceiling_per_hour)
        ask = Ask(submitter_of(run.origin), worst, run.source)
        now_held = held(ctx.ledger, settings, started_only=True, leave_out=run.run_id)
        why = refusal(settings, now_held, [ask])
        if why is not None:
            raise StageFailed(FailureReason.OVER_BUDGET, f"not started: {why}", keep=False)
        return ctx.ledger.update_run(run.run_id, start)
    finally:
        lease.release()


def run_over(ctx: context.Context, run: Run, cost: float) -> str | None:
    """Why a run whose nodes cost `cost` so far must stop at the per-run cap (None: it may go on)."""
    cap = ctx.settings.max_dollars_per_run
    if cap is None or cost < cap:
        return None
    return f"its nodes cost ${cost:.2f}; the cap is ${cap:.2f} a run (FLEET_MAX_DOLLARS_PER_RUN)"


def enforce(ctx: context.Context) -> list[str]:
    """The reaper's part: stop each run over the per-run cap, and each run that still spends once the
    fleet's day cap or its submitter's is spent; a wind-down past its time is ended. The runs stopped."""
    settings = ctx.settings
    now_held = held(ctx.ledger, settings)
    stopped: list[str] = []
    for run in now_held.runs:
        if run.stopping is not None:
            _wind_down_late(ctx, run)
            continue
        if run.state == RunState.QUEUED:
            continue  # not started: provision checks it
        why = run_over(ctx, run, now_held.cost[run.run_id])
        if why is None and run.state != RunState.FINALIZING:  # one finalizing ends its nodes itself
            why = _day_over(ctx, now_held, run)
        if why is None:
            continue
        try:
            stop(ctx, run, why)
        except FleetError as exc:  # a failed call for one run must not spare the others (the next pass)
            log.warning("budget: run %s: %s", run.run_id, exc)
            continue
        stopped.append(run.run_id)
    return stopped


def _day_over(ctx: context.Context, now_held: Held, run: Run) -> str | None:
    """Why a run must stop because the fleet's or its submitter's day cap is spent (None: neither is, or
    the run spends nothing now)."""
    if run.run_id not in now_held.spending:
        return None
    cap = ctx.settings.max_dollars_per_day
    if cap is not None and now_held.spent >= cap:
        return spent_text("the fleet's nodes", now_held.spent, cap, "FLEET_MAX_DOLLARS_PER_DAY")
    who = submitter_of(run.origin)
    found = ctx.settings.dollars_per_day_of(who)
    if found is not None and (spent := now_held.spent_by.get(str(who), 0.0)) >= found[0]:
        return spent_text(f"the runs of {who}", spent, *found)
    return None


def stop(ctx: context.Context, run: Run, why: str, task_id: str | None = None) -> None:
    """Stop a run for money, its checkpoint kept (see the module's notes). `task_id`: the stage task that
    owns the run and stops it; None (the reaper): the run's claim is taken over first, so that a task
    inside a long step on it has its next write refused."""
    owner = task_id or ctx.dispatcher.take_over(run.run_id, "budget")
    sid = run.ray_jobs.get(Stage.TRAIN.value)  # no train job yet: no checkpoint either
    training = run.state == RunState.TRAINING and run.instance is not None
    if sid is None or not training or ctx.provider(run.provider).shares_files:
        teardown(ctx, run, RunState.FAILED, FailureReason.OVER_BUDGET, why, keep=False)
        return
    try:  # no new checkpoint meanwhile; finalize's teardown stops every job of the run in any case
        node(ctx, run).stop(sid)
    except FleetError as exc:
        log.warning("run %s: could not stop its train job: %s", run.run_id, exc)

    def wind_down(r: Run) -> list[Draft]:
        if r.state != RunState.TRAINING or r.stopping is not None:
            return []
        r.stopping = why
        return enter(r, Stage.FINALIZE)

    if ctx.ledger.update_run(run.run_id, wind_down).stopping is not None:
        ctx.dispatcher.send(Stage.FINALIZE, run.run_id, after=owner)


def _wind_down_late(ctx: context.Context, run: Run) -> None:
    """End a run whose wind-down has taken longer than a finalize task may (its results stay behind)."""
    began = run.stage(Stage.FINALIZE).started or run.updated_at
    if time.time() - began < ctx.settings.finalize_time_limit_s:
        return
    ctx.dispatcher.take_over(run.run_id, "budget")
    why = f"{run.stopping}; its results did not come back within {ctx.settings.finalize_time_limit_s:g} s"
    teardown(ctx, run, RunState.FAILED, FailureReason.OVER_BUDGET, why, keep=False)
