"""prepare: on the node, run the job's `entry` script when it has one (workers.entry), then fetch (or build)
the base model and check the datasets, each as a Ray job."""

from __future__ import annotations

from celery import Task

from broker.app import app
from core.errors import FailureReason, StageFailed
from providers.node import JobStatus, NodeClient
from state.ledger import Draft
from state.models import Run
from state.payloads import PrepareFetched, RaySubmitted
from state.stages import Stage
from trainer import progress
from workers import context, entry
from workers.node_job import files_for_node, job_log, node, node_env, node_record, submit_once
from workers.runner import run_stage
from workers.stage import RETRY_POLICY, Next, enter_next

ENTRYPOINT = "python -m trainer fetch"


def step(ctx: context.Context, run: Run) -> Next:
    client = node(ctx, run)
    sid = f"{run.run_id}-{run.attempt}-fetch"

    def submit() -> None:
        client.submit(sid, ENTRYPOINT, node_env(ctx, run), files_for_node(ctx, run))

    if run.ray_jobs.get(Stage.PREPARE.value) != sid:
        # The fetch is submitted only after the entry script succeeded: once it is, the entry is behind us.
        script = entry.script_of(run)
        if script is not None and not entry.succeeded(ctx, run, client, script):
            return Next.wait_job(ctx, Stage.PREPARE, entry.submission_id(run))
    info = submit_once(ctx, run, client, Stage.PREPARE.value, sid, submit, [RaySubmitted(ray_job=sid)])
    if info is None:
        return Next.poll(Stage.PREPARE, ctx.settings.poll_interval_s)
    if not info.status.is_terminal():
        return Next.wait_job(ctx, Stage.PREPARE, sid, relay=True)
    log = job_log(ctx, run, client, sid)
    if info.status != JobStatus.SUCCEEDED:
        raise StageFailed(
            FailureReason.PREPARE_FAILED, f"fetch job {info.status}: {info.message}\n{log[-1500:]}"
        )
    data = fetched(log) or PrepareFetched()

    def done(r: Run) -> list[Draft]:
        return [*_once(r, sid, data), *enter_next(r, Stage.PREPARE)]  # the watcher may have relayed it

    ctx.ledger.update_run(run.run_id, done)
    return Next.onward(Stage.PREPARE)


def fetched(log: str) -> PrepareFetched | None:
    """What the fetch job said it fetched (its FETCHED line), once it said it."""
    said_lines = [r for r in progress.parse(log) if r["kind"] == PrepareFetched.kind]
    said = node_record(PrepareFetched.type, said_lines[-1]) if said_lines else None
    return said if isinstance(said, PrepareFetched) else None


def relay(ctx: context.Context, run: Run, client: NodeClient, sid: str) -> Run:
    """The fetch job's FETCHED line as its event as soon as it is printed (the watcher's relay while the
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
