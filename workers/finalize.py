"""finalize: bring the results back from a rented node, give the node back (one_shot), end SUCCEEDED."""

from __future__ import annotations

import time
from pathlib import Path

from celery import Task

from broker.app import app
from broker.constants import Stage
from broker.ledger import Draft
from broker.models import EventType, FailureReason, Run, RunState
from trainer import pack, progress
from trainer.errors import PackError
from workers import context
from workers.common import (
    RETRY_POLICY,
    Next,
    StageFailed,
    job_spec,
    node,
    run_stage,
    terminate_instance,
    train_job,
)
from workers.node import JobStatus

PACK_ENTRYPOINT = "python -m trainer pack"


def step(ctx: context.Context, run: Run) -> Next:
    if not run.progress.get("finished"):
        raise StageFailed(FailureReason.FINALIZE_FAILED, "the trainer reported no result")
    if not ctx.provider(run.provider).shares_files and not run.progress.get("pulled"):
        waiting = pull_results(ctx, run)
        if waiting is not None:
            return waiting
    drafts: list[Draft] = []
    if job_spec(run).one_shot:
        drafts += terminate_instance(ctx, run)

    def succeed(r: Run) -> list[Draft]:
        if r.state != RunState.FINALIZING:
            return []
        timing = r.stage(Stage.FINALIZE)
        timing.ended = time.time()
        r.state = RunState.SUCCEEDED
        return [
            *drafts,
            (EventType.STAGE_FINISHED, {"stage": Stage.FINALIZE.value, "seconds": timing.seconds}),
            (EventType.RUN_SUCCEEDED, {"output_dir": r.output_dir, "metrics": r.metrics}),
        ]

    ctx.ledger.update_run(run.run_id, succeed)
    return Next.done()


def pull_results(ctx: context.Context, run: Run) -> Next | None:
    """Copy the node's output directory into the run's own (trainer.pack through a Ray job's log);
    a Next to poll while the pack job runs, None once the results are here."""
    client = node(ctx, run)
    sid = f"{run.run_id}-{run.attempt}-pack"
    info = client.info(sid)
    if info is None:
        client.submit(sid, PACK_ENTRYPOINT, {progress.ENV_VAR: train_job(ctx, run).to_env()})
        return Next.poll(Stage.FINALIZE, ctx.settings.poll_interval_s)
    if not info.status.is_terminal():
        return Next.poll(Stage.FINALIZE, ctx.settings.poll_interval_s)
    if info.status != JobStatus.SUCCEEDED:
        tail = client.logs(sid)[-1500:]
        raise StageFailed(FailureReason.FINALIZE_FAILED, f"pack job {info.status}: {info.message}\n{tail}")
    started = time.monotonic()
    try:
        packed = pack.unpack(progress.parse(client.logs(sid)), Path(run.output_dir))
    except PackError as exc:
        raise StageFailed(FailureReason.FINALIZE_FAILED, str(exc)) from None
    pulled = {
        "output_dir": run.output_dir,
        "files": packed.files,
        "bytes": packed.bytes,
        "sha256": packed.sha256,
        "unpack_seconds": round(time.monotonic() - started, 2),
    }

    def record(r: Run) -> list[Draft]:
        r.progress["pulled"] = True
        return [(EventType.FINALIZE_PULLED, pulled)]

    ctx.ledger.update_run(run.run_id, record)
    return None


@app.task(name=Stage.FINALIZE.task_name, bind=True, **RETRY_POLICY)
def finalize(self: Task, run_id: str) -> None:
    """Wrap the run up."""
    run_stage(self, run_id, Stage.FINALIZE, step)
