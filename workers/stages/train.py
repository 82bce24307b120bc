"""train: run the trainer as a Ray job on the node and relay its progress lines as events.

Each tick reads the job's log from where the last tick stopped (the offset is in the ledger and moves
in the same transaction as the events it produced, so a line is never relayed twice).
"""

from __future__ import annotations

import time

from celery import Task

from broker.app import app
from core.errors import FailureReason, NodeLost, StageFailed
from providers.node import JobStatus, NodeClient
from state.ledger import Draft
from state.models import Run, StopSeen
from state.payloads import (
    EventType,
    TrainBatchSize,
    TrainCheckpoint,
    TrainEval,
    TrainFinished,
    TrainPending,
    TrainRestarted,
    TrainResumed,
    TrainRollback,
    TrainStarted,
    TrainStep,
    TrainStopped,
    TrainSubmitted,
    WandbUnavailable,
)
from state.stages import Stage
from trainer import lines, progress
from workers import context
from workers.ending import node_lost
from workers.node_job import files_for_node, job_log, keep_log, node, node_env, node_record, resend
from workers.runner import run_stage
from workers.stage import RETRY_POLICY, Next, enter_next

ENTRYPOINT = "python -m trainer train"
TRAINER_ERROR = "trainer: error:"  # how the trainer says it failed for a reason a rerun cannot change

# The train job's lines that become events: each event's payload is its line's model (trainer.lines).
RELAYED = (
    TrainStarted,
    TrainStep,
    TrainEval,
    TrainCheckpoint,
    TrainFinished,
    TrainResumed,
    TrainRollback,
    TrainBatchSize,
    TrainPending,
    TrainStopped,
    WandbUnavailable,
)
_EVENT_OF = {payload.kind: payload.type for payload in RELAYED}


def step(ctx: context.Context, run: Run) -> Next:
    client = node(ctx, run)
    restarts = run.progress.train_restarts
    sid = f"{run.run_id}-{run.attempt}-train" + (f"-r{restarts}" if restarts else "")

    def submit() -> None:  # the job's environment and files are made only when it is sent
        client.submit(sid, ENTRYPOINT, train_env(ctx, run), files_for_node(ctx, run))

    if run.ray_jobs.get(Stage.TRAIN.value) != sid or client.info(sid) is None:
        submit()

        def submitted(r: Run) -> list[Draft]:
            if r.ray_jobs.get(Stage.TRAIN.value) == sid:
                return []
            r.ray_jobs[Stage.TRAIN.value] = sid
            return [TrainSubmitted(ray_job=sid)]

        run = ctx.ledger.update_run(run.run_id, submitted)
    info = client.info(sid)  # read before the logs, so a finished job's log is read whole
    if info is not None and resend(ctx, run, client, sid, info, submit):
        return Next.poll(Stage.TRAIN, ctx.settings.poll_interval_s)
    run = relay(ctx, run, client, sid)
    # Its result reported and its last line printed (trainer DONE), the job's exit is not waited for: seconds
    # of teardown here, and on a GPU node a teardown that hangs (NCCL) would hold the run and bill the node.
    said_done = run.progress.finished and run.progress.done == sid
    if said_done or (info is not None and info.status == JobStatus.SUCCEEDED and run.progress.finished):
        if info is not None and not info.status.is_terminal():
            client.stop(sid)  # what is left of it is its exit: it must not hold a kept node's GPU if it hangs
        ctx.ledger.update_run(run.run_id, lambda r: enter_next(r, Stage.TRAIN))
        return Next.onward(Stage.TRAIN)
    if info is None or not info.status.is_terminal():
        return Next.wait_job(ctx, Stage.TRAIN, sid, relay=True)
    log = job_log(ctx, run, client, sid)
    if info.status == JobStatus.FAILED and (pending := gave_up(log)) is not None:
        raise StageFailed(FailureReason.RESOURCES_UNAVAILABLE, unplaced(pending))
    crashed = info.status == JobStatus.FAILED and TRAINER_ERROR not in log
    stopped = told_to_stop(log)
    if crashed and (run.num_nodes > 1 or stopped is not None) and (lost := node_lost(ctx, run)) is not None:
        # A cluster that lost a node cannot place its workers again; a machine that was taken back gave its
        # trainer a notice to keep a checkpoint: either way the run goes on on a new node.
        kept = f" (its trainer kept step {stopped.step}: {stopped.why})" if stopped is not None else ""
        raise NodeLost(f"{lost} while training{kept}")
    if crashed and stopped is not None and seen_stopped(ctx, run, sid) < ctx.settings.stopped_node_wait_s:
        # Its machine is going: see it gone (then NodeLost, above). One still there after the wait stayed (a
        # local node, a `ray job stop`): the job runs again on it, from the checkpoint its trainer kept.
        return Next.poll(Stage.TRAIN, ctx.settings.poll_interval_s)
    if crashed and restarts < ctx.settings.train_restarts:
        # Killed or crashed, not refused by the trainer: run it again; it resumes from its newest
        # checkpoint on the node (trainer.resume), not from step 0.
        after = run.progress.step
        restarted = TrainRestarted(restart=restarts + 1, after_step=after, why=info.message[:300])

        def again(r: Run) -> list[Draft]:
            if r.progress.train_restarts != restarts:
                return []
            r.progress.train_restarts = restarts + 1
            r.log_offset = 0  # the next job's log starts afresh
            return [restarted]

        ctx.ledger.update_run(run.run_id, again)
        return Next.poll(Stage.TRAIN, ctx.settings.poll_interval_s)
    why = "the trainer reported no result" if info.status == JobStatus.SUCCEEDED else info.message
    raise StageFailed(FailureReason.TRAINING_FAILED, f"train job {info.status}: {why}\n{log[-1500:]}")


def told_to_stop(log: str) -> TrainStopped | None:
    """The trainer's STOPPED line in a job's output: its machine was going, and it kept a checkpoint."""
    said = [r for r in progress.parse(log) if r["kind"] == progress.Kind.STOPPED]
    payload = node_record(EventType.TRAIN_STOPPED, said[-1]) if said else None
    return payload if isinstance(payload, TrainStopped) else None


def seen_stopped(ctx: context.Context, run: Run, sid: str) -> float:
    """How long ago the train stage first saw job `sid` ended on its machine's stop notice (0 now)."""
    now = time.time()

    def seen(r: Run) -> list[Draft]:
        if r.progress.stop_seen is None or r.progress.stop_seen.job != sid:
            r.progress.stop_seen = StopSeen(job=sid, at=now)
        return []

    run = ctx.ledger.update_run(run.run_id, seen)
    return now - run.progress.stop_seen.at if run.progress.stop_seen is not None else 0.0


def train_env(ctx: context.Context, run: Run) -> dict[str, str]:
    """The train job's environment: every Ray job's (node_env) and how long it may wait for room for its
    workers (the fleet's setting; FLEET_* names are not a job file's to set)."""
    return {**node_env(ctx, run), progress.PENDING_ENV: f"{ctx.settings.train_pending_s:g}"}


def gave_up(log: str) -> TrainPending | None:
    """The PENDING line the trainer printed when it gave up waiting for room for its workers, if any."""
    for record in reversed(list(progress.parse(log))):
        if record["kind"] == progress.Kind.PENDING and record.get("gave_up") is True:
            payload = node_record(EventType.TRAIN_PENDING, record)
            return payload if isinstance(payload, TrainPending) else None
    return None


def unplaced(pending: TrainPending) -> str:
    """The failure message: what the job asked of Ray, why it did not fit, what the cluster had."""
    demand = pending.demand or f"{pending.workers} x {pending.per_worker}"
    return (
        f"Ray could not place the training workers in {pending.waited_s:g} s: {demand} asked"
        + (f", {pending.why}" if pending.why else "")
        + (f"; the cluster has {pending.cluster}" if pending.cluster else "")
    )


def relay(ctx: context.Context, run: Run, client: NodeClient, sid: str) -> Run:
    """Turn the log lines written since the last tick into events."""
    text = client.logs(sid)
    offset = run.log_offset
    end = text.rfind("\n") + 1  # whole lines only
    if end <= offset:
        return run
    relayed, said_done = [], False
    for record in progress.parse(text[offset:end]):
        said_done = said_done or record["kind"] == progress.Kind.DONE
        event = _EVENT_OF.get(progress.Kind(record["kind"]))
        if event is None:  # a line meant for another stage (the node's own business)
            continue
        if (payload := node_record(event, record)) is not None:
            relayed.append(payload)

    advanced = False

    def apply(r: Run) -> list[Draft]:
        nonlocal advanced
        advanced = r.log_offset == offset
        if not advanced:  # another tick relayed these lines already
            return []
        r.log_offset = end
        for payload in relayed:
            _track(r, payload)
        if said_done:
            r.progress.done = sid
        return list(relayed)

    run = ctx.ledger.update_run(run.run_id, apply)
    if advanced:
        keep_log(ctx, run, sid, text[offset:end])
    return run


def _track(run: Run, payload: Draft) -> None:
    """Keep the run's latest progress and first/last eval loss in the ledger."""
    if isinstance(payload, TrainStarted):
        run.progress.total_steps = payload.total_steps
    elif isinstance(payload, TrainStep):  # the fields the line gave (RunProgress has a StepFields')
        for key in sorted(payload.model_fields_set & lines.StepFields.model_fields.keys()):
            setattr(run.progress, key, getattr(payload, key))
    elif isinstance(payload, TrainEval):
        run.metrics.setdefault("eval_loss_first", payload.eval_loss)
        run.metrics["eval_loss"] = payload.eval_loss
    elif isinstance(payload, TrainFinished):
        run.metrics.update(payload.metrics)
        run.progress.finished = True


@app.task(name=Stage.TRAIN.task_name, bind=True, **RETRY_POLICY)
def train(self: Task, run_id: str) -> None:
    """Submit the trainer and follow it."""
    run_stage(self, run_id, Stage.TRAIN, step)
