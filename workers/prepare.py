"""prepare: on the node, run the job's `entry` script when it has one (workers.entry), then fetch (or build)
the base model and check the datasets. The fetch is the start of the attempt's first train job (`python -m
trainer train --fetch`, one Ray job): prepare ends at its FETCHED line, and the train stage follows the same
job on from there. A second Ray job just to fetch cost seconds of start-up (its supervisor, its process)."""

from __future__ import annotations

from celery import Task

from broker.app import app
from broker.constants import Stage
from broker.ledger import Draft
from broker.models import Run
from broker.payloads import EventType, PrepareFetched, RaySubmitted
from core.errors import FailureReason, StageFailed
from providers.node import NodeClient
from trainer import progress
from workers import context, entry
from workers.node_job import (
    files_for_node,
    job_log,
    node,
    node_record,
    submit_once,
    train_env,
    train_sid,
)
from workers.runner import run_stage
from workers.stage import RETRY_POLICY, Next, enter_next

ENTRYPOINT = "python -m trainer train --fetch"


def step(ctx: context.Context, run: Run) -> Next:
    client = node(ctx, run)
    sid = train_sid(run)  # the train stage follows this job on once it has fetched

    def submit() -> None:
        client.submit(sid, ENTRYPOINT, train_env(ctx, run), files_for_node(ctx, run))

    if run.ray_jobs.get(Stage.PREPARE.value) != sid:
        # The job is submitted only after the entry script succeeded: once it is, the entry is behind us.
        script = entry.script_of(run)
        if script is not None and not entry.succeeded(ctx, run, client, script):
            return Next.wait_job(ctx, Stage.PREPARE, entry.submission_id(run))
    info = submit_once(ctx, run, client, Stage.PREPARE.value, sid, submit, [RaySubmitted(ray_job=sid)])
    if info is None:
        return Next.poll(Stage.PREPARE, ctx.settings.poll_interval_s)
    data = fetched(client.logs(sid))
    if data is None and not info.status.is_terminal():
        return Next.wait_job(ctx, Stage.PREPARE, sid, relay=True)
    if data is None:  # it ended before it had fetched: a prepare failure, whatever its exit
        log = job_log(ctx, run, client, sid)
        raise StageFailed(
            FailureReason.PREPARE_FAILED, f"fetch job {info.status}: {info.message}\n{log[-1500:]}"
        )

    def done(r: Run) -> list[Draft]:
        return [*_once(r, sid, data), *enter_next(r, Stage.PREPARE)]  # the watcher may have relayed it

    ctx.ledger.update_run(run.run_id, done)
    return Next.onward(Stage.PREPARE)


def fetched(log: str) -> PrepareFetched | None:
    """What the job said it fetched (its FETCHED line), once it said it."""
    lines = [r for r in progress.parse(log) if r["kind"] == progress.Kind.FETCHED]
    said = node_record(EventType.PREPARE_FETCHED, lines[-1]) if lines else None
    return said if isinstance(said, PrepareFetched) else None


def relay(ctx: context.Context, run: Run, client: NodeClient, sid: str) -> Run:
    """The job's FETCHED line as its event as soon as it is printed (the watcher's relay while the
    run waits on the job), so it is not held until the prepare task's turn; recorded once."""
    if run.progress.fetched == sid or (data := fetched(client.logs(sid))) is None:
        return run
    return ctx.ledger.update_run(run.run_id, lambda r: _once(r, sid, data))


def _once(run: Run, sid: str, data: PrepareFetched) -> list[Draft]:
    """The fetch job `sid`'s prepare.fetched event, unless the run recorded it already."""
    if run.progress.fetched == sid:
        return []
    run.progress.fetched = sid
    return [data]


@app.task(name=Stage.PREPARE.task_name, bind=True, **RETRY_POLICY)
def prepare(self: Task, run_id: str) -> None:
    """Get the node ready to train."""
    run_stage(self, run_id, Stage.PREPARE, step)
