"""finalize: record the result, give the node back (one_shot), and end the run SUCCEEDED."""

from __future__ import annotations

import time

from celery import Task

from broker.app import app
from broker.constants import Stage
from broker.ledger import Draft
from broker.models import EventType, FailureReason, Run, RunState
from workers import context
from workers.common import RETRY_POLICY, Next, StageFailed, job_spec, run_stage, terminate_instance


def step(ctx: context.Context, run: Run) -> Next:
    if not run.progress.get("finished"):
        raise StageFailed(FailureReason.FINALIZE_FAILED, "the trainer reported no result")
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


@app.task(name=Stage.FINALIZE.task_name, bind=True, **RETRY_POLICY)
def finalize(self: Task, run_id: str) -> None:
    """Wrap the run up."""
    run_stage(self, run_id, Stage.FINALIZE, step)
