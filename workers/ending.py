"""How a run's nodes end: terminate every node of an attempt, tell a lost node, replace a lost node with the
next attempt's, and tear a failed or cancelled run down (or keep its node for debugging)."""

from __future__ import annotations

import logging
import time

from core.errors import FailureReason, FleetError, clipped
from providers.base import NodeState
from state.cost import run_cost
from state.ledger import Draft
from state.models import InstanceState, Run
from state.payloads import (
    InstanceKept,
    InstanceTerminated,
    InstanceTerminating,
    RunCancelled,
    RunFailed,
    RunPreempted,
)
from state.stages import RunState, Stage
from state.worstcase import KEEP_MAX_S  # the longest a failed run's node is kept for debugging
from workers import context, spot
from workers.node_job import node
from workers.stage import enter
from workers.wandb_end import record_early_end

log = logging.getLogger("trainfleet.workers")


def terminate_instance(ctx: context.Context, run: Run, fresh: bool = True) -> list[Draft]:
    """Terminate the run's instances (every node of its attempt: a cluster goes as one) and confirm those
    gone (`fresh`: by the vendor's list asked after the terminate, else by the fleet's shared list, which
    may show one a moment longer: `end_nodes` then says when it went); returns the events that say so. One
    failed call does not spare the others: each is recorded TERMINATING first, so the reaper retries what
    this could not end; the first error is raised after."""
    if run.instance is None:
        return []
    drafts: list[Draft] = []
    failed: FleetError | None = None
    for name in run.instance_names:
        try:
            drafts += _terminate_one(ctx, run.provider, name, fresh)
        except FleetError as exc:
            failed = failed or exc
    if failed is not None:
        raise failed
    return drafts


def end_nodes(ctx: context.Context, run: Run) -> tuple[list[Draft], dict[str, str]]:
    """Terminate the run's instances, once (those already TERMINATING are only looked at), and confirm
    those gone by the fleet's shared list: the events, and those still listed ({name: state}: what to wait
    on; the reaper confirms them in any case)."""
    provider = ctx.provider(run.provider)
    records = {name: ctx.ledger.get_instance(name) for name in run.instance_names}
    if any(r is not None and r.state not in _ENDING for r in records.values()):
        drafts = terminate_instance(ctx, run, fresh=False)
        records = {name: ctx.ledger.get_instance(name) for name in run.instance_names}
    else:
        drafts = []
    listed: dict[str, str] = {}
    for name, record in records.items():
        if record is None or record.state != InstanceState.TERMINATING:
            continue
        found = provider.get(name)
        if found is None:
            drafts += _gone(ctx, run.provider, name)
        else:
            listed[name] = found.state.value
    return drafts, listed


_ENDING = (InstanceState.TERMINATING, InstanceState.TERMINATED, InstanceState.LOST)


def _gone(ctx: context.Context, provider_name: str, name: str) -> list[Draft]:
    """Instance `name`, terminated, is gone: TERMINATED, said once (the reaper may have confirmed it first:
    it lists instances while this process waits on the provider's terminate)."""
    ctx.provider(provider_name).forget(name)
    if ctx.ledger.get_instance(name) is None:
        return [InstanceTerminated(instance=name)]  # no record: nothing else confirms it
    ended = ctx.ledger.update_instance(name, InstanceState.TERMINATING, state=InstanceState.TERMINATED)
    return [InstanceTerminated(instance=name)] if ended is not None else []


def _terminate_one(ctx: context.Context, provider_name: str, name: str, fresh: bool) -> list[Draft]:
    provider = ctx.provider(provider_name)
    inst = ctx.ledger.get_instance(name)
    if inst is not None and inst.state.is_terminal():
        return []
    now = time.time()
    ctx.ledger.update_instance(
        name,
        state=InstanceState.TERMINATING,
        terminate_requested_at=now,
        terminate_attempts=1,
        next_terminate_at=now + ctx.settings.reap_interval_s / 2,  # the next reap pass calls again
    )
    provider.terminate(name)
    if provider.gone(name, fresh):
        return _gone(ctx, provider_name, name)
    # Not gone yet: the reaper confirms (and retries) until the provider no longer lists it.
    return [InstanceTerminating(instance=name)]


def node_lost(ctx: context.Context, run: Run) -> str | None:
    """Why the run's node (or one node of its cluster: the cluster is no use without it) is gone for good,
    or None when they are all there, or may be (see `instance_lost`)."""
    if run.instance is None:
        return None
    for name in run.instance_names:
        if (why := instance_lost(ctx, run, name)) is not None:
            return why
    return None


def instance_lost(ctx: context.Context, run: Run, name: str) -> str | None:
    """Why instance `name` of the run is gone for good (stopped, preempted, failed, or unlisted
    `lost_after_misses` looks in a row), or None when it is there, or may be (the provider did not answer:
    ask again later)."""
    try:
        found = ctx.provider(run.provider).get(name)
    except FleetError:
        return None
    record = ctx.ledger.get_instance(name)
    if found is not None:
        if record is not None and record.missed:
            ctx.ledger.update_instance(name, missed=0)
        if found.state in (NodeState.STOPPED, NodeState.FAILED):
            return f"instance {name}: {found.message or found.state.value.lower()}"
        return None
    if record is None:
        return None  # never asked for (a cluster's node whose create has not gone out yet)
    missed = record.missed + 1
    ctx.ledger.update_instance(name, missed=missed)
    if missed < ctx.settings.lost_after_misses:
        return None
    return f"instance {name}: not listed by {run.provider} ({missed} looks in a row)"


def replace_node(ctx: context.Context, run: Run, why: str, task_id: str, at_boot: bool = False) -> None:
    """The run's node is lost: end what is left of it and start the run again on a new node (the next
    attempt's), after a back-off; training resumes from its newest checkpoint. A lost node is not the
    run's fault, so it does not use up train_restarts, but only `max_preemptions` are replaced. `at_boot`:
    it stopped before it came up (counted in the run's `boot_losses`: workers.stages.provision)."""
    if run.state.is_terminal():
        return
    if run.stopping is not None:  # stopped for money (workers.budget): never started again
        message = f"{run.stopping}; its node was lost before its results came back ({why})"
        teardown(ctx, run, RunState.FAILED, FailureReason.OVER_BUDGET, message, keep=False)
        return
    done = run.preemptions
    if done >= ctx.settings.max_preemptions:
        message = f"{why}; {done} lost nodes replaced already (FLEET_MAX_PREEMPTIONS={done})"
        teardown(ctx, run, RunState.FAILED, FailureReason.INSTANCE_LOST, message, keep=False)
        return
    allowed, may_leave = spot.max_preemptions(run), spot.may_leave(run)
    spent = allowed is not None and done >= allowed
    if spent and not may_leave:  # INTERRUPTABLE: as many spot machines as the job allows
        message = f"{why}; {done} spot machines replaced already (max_preemptions: {allowed})"
        teardown(ctx, run, RunState.FAILED, FailureReason.INSTANCE_LOST, message, keep=False)
        return
    leaving = None
    if may_leave and spent:
        leaving = f"{why}; {done + 1} spot machines lost, more than max_preemptions ({allowed})"
    elif may_leave and at_boot and run.boot_losses >= 1:
        leaving = f"{why}; a second spot machine stopped before it came up"
    try:  # a preempted node may still bill (vast.ai bills a stopped instance's disk): end it
        drafts = terminate_instance(ctx, run)
    except FleetError as exc:  # the reaper retries the terminate (the instance is TERMINATING)
        log.warning("run %s: terminating lost node %s: %s", run.run_id, run.instance, exc)
        drafts = []
    wait = min(ctx.settings.preempt_backoff_s * 2**done, 600.0)
    lost, attempt = run.instance, run.attempt

    def again(r: Run) -> list[Draft]:
        if r.attempt != attempt or r.state.is_terminal():
            return []  # another task replaced it already, or the run ended
        r.attempt += 1
        r.preemptions += 1
        r.boot_losses += at_boot
        r.instance, r.ray_jobs, r.log_offset = None, {}, 0
        r.progress.finished = False
        r.progress.cluster = []  # the new attempt's nodes join a new cluster
        left = spot.leave(r, lost or r.instance_name, leaving) if leaving is not None else []
        preempted = RunPreempted(
            instance=lost,
            why=why[:300],
            preemption=r.preemptions,
            max_preemptions=ctx.settings.max_preemptions,
            at_step=r.progress.step,
            next_instance=r.instance_name,
            retry_in_s=wait,
        )
        return [*drafts, preempted, *left, *enter(r, Stage.PROVISION)]

    if not ctx.ledger.update_run(run.run_id, again).state.is_terminal():
        ctx.dispatcher.send(Stage.PROVISION, run.run_id, after=task_id, countdown=wait)


def teardown(
    ctx: context.Context,
    run: Run,
    final: RunState,
    reason: FailureReason | None,
    message: str,
    keep: bool = True,
) -> None:
    """End a run that failed or was cancelled: stop its Ray jobs, give its node back (or keep it for
    debugging, when the job says one_shot: false and `keep`), record why."""
    if run.state.is_terminal():
        return
    ctx.ledger.check_fence(run.run_id)  # a task that lost the run must not stop its new owner's Ray jobs
    drafts: list[Draft] = []
    if run.instance is not None and run.ray_jobs:
        try:
            client = node(ctx, run)
            for sid in run.ray_jobs.values():
                client.stop(sid)
        except FleetError as exc:
            log.warning("run %s: could not stop its Ray jobs: %s", run.run_id, exc)
    spec = run.spec
    if keep and final == RunState.FAILED and not spec.one_shot and run.instance is not None:
        # Kept for debugging, but never without an end: terminate_after from now, at most a day.
        lifetime = spec.section.terminate_after
        keep_until = time.time() + (KEEP_MAX_S if lifetime == -1 else min(lifetime, KEEP_MAX_S))
        for name in run.instance_names:
            ctx.ledger.update_instance(name, keep_until=keep_until)
        cluster = {"instances": run.instance_names} if run.num_nodes > 1 else {}
        drafts.append(
            InstanceKept(instance=run.instance, why="one_shot is false", until=keep_until, **cluster)
        )
    else:
        try:
            drafts += terminate_instance(ctx, run)
        except FleetError as exc:  # the run ends all the same: its nodes are TERMINATING, the reaper retries
            log.warning("run %s: terminating its nodes: %s (the reaper retries)", run.run_id, exc)
    cost = run_cost(ctx.ledger, run)

    # Before the run shows its end: whoever waits for it (`fleet run`) finds its W&B run complete.
    record_early_end(ctx, run, reason, message)

    def close(r: Run) -> list[Draft]:
        if r.state.is_terminal():
            return []
        now = time.time()
        if (stage := r.state.stage) is not None and r.state != RunState.QUEUED:
            r.stage(stage).ended = now
        # What failed (the message's first line) and why (its end: a traceback's cause), each kept whole.
        r.state, r.failure_reason, r.failure_message = final, reason, clipped(message, 2000)
        ended = RunCancelled if final == RunState.CANCELLED else RunFailed
        return [*drafts, ended(reason=reason, message=clipped(message, 500), cost_usd=cost)]

    ctx.ledger.update_run(run.run_id, close)
