"""The shape every stage task shares: claim the run, check it, take one step, hand it on.

A step is a plain function `step(ctx, run) -> Next`. It never waits long: to wait, it returns
`Next.poll()` and the same stage's task is sent again after a short countdown.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
from pydantic import SecretStr

from broker import sweeps
from broker.constants import Stage
from broker.cost import run_cost
from broker.ledger import Draft
from broker.models import STATE_OF_STAGE, EventType, InstanceState, Run, RunState
from core.errors import RETRYABLE, FailureReason, FleetError, NodeLost, StageFailed
from jobs import shipping
from jobs.redact import redact_job
from jobs.spec import JobSpec
from providers.base import NodeState
from providers.node import NodeClient
from trainer import progress
from trainer.config import TrainJob
from workers import context, wandb_plan

if TYPE_CHECKING:
    from collections.abc import Callable

    from celery import Task

log = logging.getLogger("trainfleet.workers")

KEEP_MAX_S = 24 * 3600  # the longest a failed run's node is kept for debugging

# Every stage task: retry only what can get better by itself, with jittered exponential back-off.
MAX_RETRY_AFTER_S = 600.0  # a provider's Retry-After is honoured up to this
RETRY_POLICY: dict[str, Any] = {
    "autoretry_for": RETRYABLE,
    "retry_backoff": 1,
    "retry_backoff_max": 60,
    "retry_jitter": True,
    "max_retries": 12,
}


@dataclass(frozen=True)
class Next:
    """What a step wants next: poll this stage again, move to another stage, or nothing."""

    stage: Stage | None
    countdown: float = 0.0

    @staticmethod
    def poll(stage: Stage, countdown: float) -> Next:
        return Next(stage, countdown)

    @staticmethod
    def advance(stage: Stage) -> Next:
        return Next(stage, 0.0)

    @staticmethod
    def done() -> Next:
        return Next(None)


NODE_STAGES = (Stage.PREPARE, Stage.TRAIN, Stage.FINALIZE)  # the stages that work on the run's node


def run_stage(task: Task, run_id: str, stage: Stage, step: Callable[[context.Context, Run], Next]) -> None:
    """The body of every stage task; when it ends a sweep's child, the sweep gives its slot to the next."""
    try:
        _run_stage(task, run_id, stage, step)
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
    cap = ctx.settings.max_dollars_per_run
    if cap is not None and (cost := run_cost(ctx.ledger, run)) >= cap:
        why = f"its nodes cost ${cost:.2f}; the cap is ${cap:.2f} a run (FLEET_MAX_DOLLARS_PER_RUN)"
        teardown(ctx, run, RunState.FAILED, FailureReason.OVER_BUDGET, why, keep=False)
        return
    current = run.state.stage
    if current is not None and current != stage:
        ctx.dispatcher.send(current, run_id, after=task_id)  # a stale message: hand to the right stage
        return
    try:
        nxt = step(ctx, run)
    except StageFailed as exc:
        teardown(ctx, ctx.ledger.get_run(run_id), RunState.FAILED, exc.reason, str(exc))
        return
    except NodeLost as exc:
        replace_node(ctx, ctx.ledger.get_run(run_id), str(exc), task_id)
        return
    except FleetError as exc:
        if stage in NODE_STAGES and exc.retryable and (lost := node_lost(ctx, run)) is not None:
            replace_node(ctx, ctx.ledger.get_run(run_id), lost, task_id)
            return
        retries, limit = task.request.retries or 0, task.max_retries
        if exc.retryable and (limit is None or retries < limit):
            wait = getattr(exc, "retry_after", None)
            if wait is not None:  # the provider said when: wait that long, not the usual back-off
                raise task.retry(exc=exc, countdown=min(float(wait), MAX_RETRY_AFTER_S)) from None
            raise  # Celery's autoretry sends this task again (same id, so it still owns the run)
        why = f"gave up after {retries} retries: {exc}" if exc.retryable else str(exc)
        teardown(ctx, ctx.ledger.get_run(run_id), RunState.FAILED, _reason_for(stage), why)
        return
    except Exception as exc:  # a bug must not leave a node billing: log it, clean up, fail the run
        log.exception("run %s: %s step crashed", run_id, stage)
        teardown(ctx, ctx.ledger.get_run(run_id), RunState.FAILED, FailureReason.INTERNAL_ERROR, repr(exc))
        return
    if nxt.stage is not None:
        ctx.dispatcher.send(nxt.stage, run_id, after=task_id, countdown=nxt.countdown)


def _reason_for(stage: Stage) -> FailureReason:
    return {
        Stage.PROVISION: FailureReason.PROVISIONING_FAILED,
        Stage.PREPARE: FailureReason.PREPARE_FAILED,
        Stage.TRAIN: FailureReason.TRAINING_FAILED,
        Stage.FINALIZE: FailureReason.FINALIZE_FAILED,
    }[stage]


def enter(run: Run, stage: Stage) -> list[Draft]:
    """Move a run into `stage` (closing the one it was in); returns the events that says."""
    drafts: list[Draft] = []
    now = time.time()
    previous = run.state.stage if run.state != RunState.QUEUED else None
    if previous is not None:
        timing = run.stage(previous)
        if timing.ended is None:
            timing.ended = now
            drafts.append((EventType.STAGE_FINISHED, {"stage": previous.value, "seconds": timing.seconds}))
    run.state = STATE_OF_STAGE[stage]
    run.stage(stage).started = now
    drafts.append((EventType.STAGE_STARTED, {"stage": stage.value}))
    return drafts


def job_spec(run: Run) -> JobSpec:
    return JobSpec.model_validate(run.spec)


def train_job(ctx: context.Context, run: Run) -> TrainJob:
    """What the node gets: the training config and where to put things (no secrets). A node that shares
    this machine's files uses the run's own directories; a rented one gets paths under its own root."""
    spec = job_spec(run)
    if ctx.provider(run.provider).shares_files:
        dirs = {
            "work_dir": run.run_dir,
            "output_dir": run.output_dir,
            "cache_dir": str(ctx.settings.cache_dir),
        }
    else:
        work = f"runs/{run.run_id}"
        output = Path(run.output_dir).relative_to(run.run_dir).as_posix()
        dirs = {"work_dir": work, "output_dir": f"{work}/{output}", "cache_dir": "cache"}
    return TrainJob(
        run_id=run.run_id,
        config=spec.train,
        use_gpu=spec.gpu_count > 0,
        job_yaml=shown_job(ctx, run),
        wandb=wandb_plan.for_trainer(ctx, run),
        **dirs,
    )


def shown_job(ctx: context.Context, run: Run) -> str | None:
    """The run's job file as a model card may show it (jobs.redact), or None when it is not at hand."""
    try:
        text = (Path(run.run_dir) / "job.yml").read_text(encoding="utf-8")
    except OSError:
        return None
    known = [v.get_secret_value() for v in ctx.provider_context.credentials.values()]
    return redact_job(text, known)


NODE_SECRETS = ("HF_TOKEN", "WANDB_API_KEY")  # what the node itself uses, when the fleet has them


def node_secrets(ctx: context.Context) -> dict[str, SecretStr]:
    """The credentials a node gets in its environment at start (never in a Ray job's runtime_env)."""
    found = ctx.provider_context.credentials
    return {name: found[name] for name in NODE_SECRETS if name in found}


def node_env(ctx: context.Context, run: Run) -> dict[str, str]:
    """The environment of each of the run's Ray jobs: the TrainJob and where the hub is. No secrets."""
    env = {progress.ENV_VAR: train_job(ctx, run).to_env(), "HF_ENDPOINT": ctx.settings.hf_endpoint}
    if ctx.settings.hf_hub_disable_xet:
        env["HF_HUB_DISABLE_XET"] = "1"
    return env


def files_for_node(ctx: context.Context, run: Run) -> Path | None:
    """The directory that travels with the run's Ray jobs as their working_dir (None: the node shares
    this machine's files)."""
    if ctx.provider(run.provider).shares_files:
        return None
    files = shipping.ship_dir(run.run_dir)
    return files if files.is_dir() else None


def node(ctx: context.Context, run: Run) -> NodeClient:
    assert run.instance is not None
    return NodeClient(ctx.provider(run.provider).endpoint(run.instance))


def terminate_instance(ctx: context.Context, run: Run) -> list[Draft]:
    """Terminate the run's instances (every node of its attempt: a cluster goes as one) and confirm they
    are gone; returns the events that say so. One failed call does not spare the others: each is recorded
    TERMINATING first, so the reaper retries what this could not end; the first error is raised after."""
    if run.instance is None:
        return []
    drafts: list[Draft] = []
    failed: FleetError | None = None
    for name in run.instance_names:
        try:
            drafts += _terminate_one(ctx, run.provider, name)
        except FleetError as exc:
            failed = failed or exc
    if failed is not None:
        raise failed
    return drafts


def _terminate_one(ctx: context.Context, provider_name: str, name: str) -> list[Draft]:
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
    if provider.get(name) is None:
        ctx.ledger.update_instance(name, state=InstanceState.TERMINATED)
        return [(EventType.INSTANCE_TERMINATED, {"instance": name})]
    # Not gone yet: the reaper confirms (and retries) until the provider no longer lists it.
    return [(EventType.INSTANCE_TERMINATING, {"instance": name})]


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


def replace_node(ctx: context.Context, run: Run, why: str, task_id: str) -> None:
    """The run's node is lost: end what is left of it and start the run again on a new node (the next
    attempt's), after a back-off; training resumes from its newest checkpoint. A lost node is not the
    run's fault, so it does not use up train_restarts, but only `max_preemptions` are replaced."""
    if run.state.is_terminal():
        return
    done = run.preemptions
    if done >= ctx.settings.max_preemptions:
        message = f"{why}; {done} lost nodes replaced already (FLEET_MAX_PREEMPTIONS={done})"
        teardown(ctx, run, RunState.FAILED, FailureReason.INSTANCE_LOST, message, keep=False)
        return
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
        r.instance, r.ray_jobs, r.log_offset = None, {}, 0
        r.progress.pop("finished", None)
        r.progress.pop("cluster", None)  # the new attempt's nodes join a new cluster
        data = {
            "instance": lost,
            "why": why[:300],
            "preemption": r.preemptions,
            "max_preemptions": ctx.settings.max_preemptions,
            "at_step": r.progress.get("step"),
            "next_instance": r.instance_name,
            "retry_in_s": wait,
        }
        return [*drafts, (EventType.RUN_PREEMPTED, data), *enter(r, Stage.PROVISION)]

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
    drafts: list[Draft] = []
    if run.instance is not None and run.ray_jobs:
        try:
            client = node(ctx, run)
            for sid in run.ray_jobs.values():
                client.stop(sid)
        except FleetError as exc:
            log.warning("run %s: could not stop its Ray jobs: %s", run.run_id, exc)
    spec = job_spec(run)
    if keep and final == RunState.FAILED and not spec.one_shot and run.instance is not None:
        # Kept for debugging, but never without an end: terminate_after from now, at most a day.
        lifetime = spec.section.terminate_after
        keep_until = time.time() + (KEEP_MAX_S if lifetime == -1 else min(lifetime, KEEP_MAX_S))
        for name in run.instance_names:
            ctx.ledger.update_instance(name, keep_until=keep_until)
        drafts.append(
            (
                EventType.INSTANCE_KEPT,
                {"instance": run.instance, "why": "one_shot is false", "until": keep_until}
                | ({"instances": run.instance_names} if run.num_nodes > 1 else {}),
            )
        )
    else:
        drafts += terminate_instance(ctx, run)
    cost = run_cost(ctx.ledger, run)

    def close(r: Run) -> list[Draft]:
        if r.state.is_terminal():
            return []
        now = time.time()
        if (stage := r.state.stage) is not None and r.state != RunState.QUEUED:
            r.stage(stage).ended = now
        r.state, r.failure_reason, r.failure_message = final, reason, message[-2000:]
        kind = EventType.RUN_CANCELLED if final == RunState.CANCELLED else EventType.RUN_FAILED
        data = {"reason": reason.value if reason else None, "message": message[-500:], "cost_usd": cost}
        return [*drafts, (kind, data)]

    ctx.ledger.update_run(run.run_id, close)
