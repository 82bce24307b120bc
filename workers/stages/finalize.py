"""finalize: publish the results (HF Hub, from the node), bring them back from a rented node, give the
node back (one_shot), and end the run SUCCEEDED. A run that only prepared its datasets (`prepare_ds_only`)
has no model to publish: its output (what was prepared, and where) is brought back, nothing is pushed.

Each of the first two is a short Ray job on the node, submitted once per attempt (its submission id says
what it is) and polled; its progress lines say what it did. A run that reached the hub keeps going when
its results are too large to travel back: they are where the user asked for them.
"""

from __future__ import annotations

import time
from pathlib import Path

from celery import Task

from broker.app import app
from core.errors import FailureReason, StageFailed
from providers.node import JobStatus
from state.cost import run_cost
from state.ledger import Draft
from state.models import Run
from state.payloads import FinalizePulled, HubPush, RunSucceeded, StageFinished
from state.stages import RunState, Stage
from trainer import pack, progress
from trainer.errors import PackError
from workers import context
from workers.ending import end_nodes
from workers.node_job import job_log, node, node_env, resend
from workers.runner import run_stage
from workers.stage import RETRY_POLICY, Next

PUSH_ENTRYPOINT = "python -m trainer push"
PACK_ENTRYPOINT = "python -m trainer pack"


def step(ctx: context.Context, run: Run) -> Next:
    if run.stopping is not None:
        return wind_down(ctx, run)
    if not run.progress.finished:
        raise StageFailed(FailureReason.FINALIZE_FAILED, "the trainer reported no result")
    if run.spec.hub_repo and not run.progress.pushed:
        waiting = push_results(ctx, run)
        if waiting is not None:
            return waiting
        run = ctx.ledger.get_run(run.run_id)
    if not ctx.provider(run.provider).shares_files and not run.progress.pulled:
        waiting = pull_results(ctx, run)
        if waiting is not None:
            return waiting
    drafts: list[Draft] = []
    if run.spec.one_shot:
        drafts, listed = end_nodes(ctx, run)
        if listed and (until := _confirm_until(ctx, run)) > time.time():
            # Terminated, still listed: the watcher wakes this step when the shared list drops it (no
            # list call of its own per run); past `until` the run ends and the reaper confirms.
            if drafts:
                ctx.ledger.update_run(run.run_id, lambda r: drafts)
            return Next.wait_nodes(ctx, Stage.FINALIZE, listed, until)
    cost = run_cost(
        ctx.ledger, run
    )  # a node kept alive goes on costing; the reaper's events say when it ends

    def succeed(r: Run) -> list[Draft]:
        if r.state != RunState.FINALIZING:
            return []
        timing = r.stage(Stage.FINALIZE)
        timing.ended = time.time()
        r.state = RunState.SUCCEEDED
        return [
            *drafts,
            StageFinished(stage=Stage.FINALIZE, seconds=timing.seconds),
            RunSucceeded(output_dir=r.output_dir, metrics=r.metrics, hub=r.progress.hub, cost_usd=cost),
        ]

    ctx.ledger.update_run(run.run_id, succeed)
    return Next.done()


def wind_down(ctx: context.Context, run: Run) -> Next:
    """A run stopped for money (workers.budget): its output directory (the adapter and the checkpoints so
    far) brought back from a rented node, then the run fails OVER_BUDGET, its nodes terminated by the
    teardown (no hub push: it did not finish)."""
    why = run.stopping or "stopped for money"
    if not ctx.provider(run.provider).shares_files and not run.progress.pulled:
        try:
            waiting = pull_results(ctx, run)
        except StageFailed as exc:
            message = f"{why}; its results could not be brought back: {exc}"
            raise StageFailed(FailureReason.OVER_BUDGET, message, keep=False) from None
        if waiting is not None:
            return waiting
    message = f"{why}; its output so far, checkpoints included, is in {run.output_dir}"
    raise StageFailed(FailureReason.OVER_BUDGET, message, keep=False)


def _confirm_until(ctx: context.Context, run: Run) -> float:
    """How long a finalize waits to see its terminated node gone: a reap interval from the terminate."""
    record = ctx.ledger.get_instance(run.instance) if run.instance else None
    asked = record.terminate_requested_at if record is not None else None
    return (asked or time.time()) + ctx.settings.reap_interval_s


def node_job(ctx: context.Context, run: Run, what: str, entrypoint: str) -> str | Next:
    """Run `entrypoint` on the node once for this attempt: its log once it succeeded, a Next to poll while
    it runs; StageFailed (with the log's tail) when it failed."""
    client = node(ctx, run)
    sid = f"{run.run_id}-{run.attempt}-{what}"

    def submit() -> None:  # the job's environment is made only when it is sent
        client.submit(sid, entrypoint, node_env(ctx, run))

    info = client.info(sid)
    if info is None:
        submit()
        return Next.poll(Stage.FINALIZE, ctx.settings.poll_interval_s)
    if resend(ctx, run, client, sid, info, submit):
        return Next.poll(Stage.FINALIZE, ctx.settings.poll_interval_s)
    if not info.status.is_terminal():
        return Next.wait_job(ctx, Stage.FINALIZE, sid)
    log = job_log(ctx, run, client, sid)
    if info.status != JobStatus.SUCCEEDED:
        raise StageFailed(
            FailureReason.FINALIZE_FAILED, f"{what} job {info.status}: {info.message}\n{log[-1500:]}"
        )
    return log


def push_results(ctx: context.Context, run: Run) -> Next | None:
    """Publish the results to hub_model_id from the node (trainer.push); None once they are there."""
    log = node_job(ctx, run, "push", PUSH_ENTRYPOINT)
    if isinstance(log, Next):
        return log
    pushed = [r for r in progress.parse(log) if r["kind"] == HubPush.kind]
    if not pushed:
        raise StageFailed(FailureReason.FINALIZE_FAILED, "the push job said nothing of where it pushed")
    hub = HubPush.model_validate({k: pushed[-1].get(k) for k in HubPush.model_fields})

    def record(r: Run) -> list[Draft]:
        r.progress.hub = hub
        return [hub]

    ctx.ledger.update_run(run.run_id, record)
    return None


def pull_results(ctx: context.Context, run: Run) -> Next | None:
    """Copy the node's output directory into the run's own (trainer.pack through a Ray job's log); None
    once the results are here, or (pushed to the hub already) too large to travel."""
    entrypoint = PACK_ENTRYPOINT + (" --skip-over-limit" if run.progress.pushed else "")
    log = node_job(ctx, run, "pack", entrypoint)
    if isinstance(log, Next):
        return log
    started = time.monotonic()
    try:
        packed = pack.unpack(progress.parse(log), Path(run.output_dir))
    except PackError as exc:
        raise StageFailed(FailureReason.FINALIZE_FAILED, str(exc)) from None
    pulled = FinalizePulled(
        output_dir=run.output_dir,
        files=packed.files,
        bytes=packed.bytes,
        sha256=packed.sha256,
        unpack_seconds=round(time.monotonic() - started, 2),
    )
    if packed.skipped:
        pulled = FinalizePulled(skipped=packed.skipped, files=packed.files)

    def record(r: Run) -> list[Draft]:
        r.progress.pulled = True
        return [pulled]

    ctx.ledger.update_run(run.run_id, record)
    return None


@app.task(name=Stage.FINALIZE.task_name, bind=True, **RETRY_POLICY)
def finalize(self: Task, run_id: str) -> None:
    """Wrap the run up."""
    run_stage(self, run_id, Stage.FINALIZE, step)
