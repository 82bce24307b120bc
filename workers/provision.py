"""provision: find or create the run's node (intent first, lookup by name before any create), then
poll until its Ray head answers."""

from __future__ import annotations

import time

from celery import Task

from broker.app import app
from broker.constants import Stage
from broker.ledger import Draft
from broker.models import EventType, FailureReason, Instance, InstanceState, Run, RunState
from fleet.crashpoints import CrashPoint, crash_point
from fleet.errors import FleetError, ProviderUnavailable
from providers.base import LaunchRequest, NodeState
from workers import context, wandb_plan
from workers.common import (
    RETRY_POLICY,
    Next,
    NodeLost,
    StageFailed,
    enter,
    job_spec,
    node_lost,
    node_secrets,
    run_stage,
)


def step(ctx: context.Context, run: Run) -> Next:
    if run.state == RunState.QUEUED:
        run = ctx.ledger.update_run(run.run_id, lambda r: _start(ctx, r))
    provider = ctx.provider(run.provider)
    name = run.instance_name
    if ctx.ledger.get_instance(name) is None:
        # The intent is written before the create call, so a crash in between leaves a name to look up.
        ctx.ledger.put_instance(Instance(name=name, provider=run.provider, run_id=run.run_id))
    if run.instance != name:

        def attach(r: Run) -> list[Draft]:
            r.instance = name
            return []

        run = ctx.ledger.update_run(run.run_id, attach)
    record = ctx.ledger.get_instance(name)
    assert record is not None
    found = provider.get(name)
    if found is None and record.state != InstanceState.REQUESTED:
        # Created, but not listed (now): lists lag, so it is lost only after several looks in a row;
        # never created again under this name.
        if (lost := node_lost(ctx, run)) is not None:
            raise NodeLost(f"{lost} while starting")
        return Next.poll(Stage.PROVISION, ctx.settings.poll_interval_s)
    if found is None:
        called = record.create_called_at
        if called is not None and time.time() - called < ctx.settings.create_settle_s:
            # An earlier create call had no clear answer (a timeout, a 5xx): the vendor may still carry
            # it out. Look it up by name until it has had time to show, rather than create a second one.
            return Next.poll(Stage.PROVISION, ctx.settings.poll_interval_s)
        request = LaunchRequest(
            name,
            run.run_id,
            job_spec(run).section,
            node_secrets(ctx),
            heartbeat_timeout_s=ctx.settings.node_heartbeat_timeout_s,
        )
        ctx.ledger.update_instance(name, create_called_at=time.time())
        try:
            found = provider.launch(request)
        except FleetError as exc:
            if _refused(exc):
                ctx.ledger.update_instance(name, create_called_at=None)  # a clear no: nothing was made
            raise
        crash_point(CrashPoint.AFTER_CREATE_CALL)
        ctx.ledger.update_instance(
            name,
            state=InstanceState.STARTING,
            provider_id=found.provider_id,
            price_per_hour=found.price_per_hour,
        )
        requested = {"instance": name, "provider": run.provider, "price_per_hour": found.price_per_hour}
        _emit(ctx, run, EventType.INSTANCE_REQUESTED, requested)
    elif record.state == InstanceState.REQUESTED:
        ctx.ledger.update_instance(name, state=InstanceState.STARTING, provider_id=found.provider_id)
        _emit(ctx, run, EventType.INSTANCE_ADOPTED, {"instance": name, "provider": run.provider})

    if found.state == NodeState.RUNNING:
        endpoint = provider.endpoint(name)
        ctx.ledger.update_instance(name, state=InstanceState.RUNNING, dashboard_url=endpoint.dashboard_url)

        def ready(r: Run) -> list[Draft]:
            return [
                (EventType.INSTANCE_READY, {"instance": name, "dashboard_url": endpoint.dashboard_url}),
                *enter(r, Stage.PREPARE),
            ]

        ctx.ledger.update_run(run.run_id, ready)
        return Next.advance(Stage.PREPARE)
    if found.state == NodeState.STOPPED:  # preempted or outbid before it came up
        raise NodeLost(f"instance {name}: {found.message}")
    if found.state == NodeState.FAILED:
        raise StageFailed(FailureReason.PROVISIONING_FAILED, f"instance {name}: {found.message}")
    started = run.stage(Stage.PROVISION).started or run.created_at
    if time.time() - started > ctx.settings.node_ready_timeout_s:
        raise StageFailed(
            FailureReason.NODE_TIMEOUT,
            f"instance {name} not ready after {ctx.settings.node_ready_timeout_s:.0f} s",
        )
    return Next.poll(Stage.PROVISION, ctx.settings.poll_interval_s)


def _refused(exc: FleetError) -> bool:
    """Whether a failed create call surely made nothing: the vendor said no (no capacity, a bad request or
    key), or asked to be called later (429). A timeout or a 5xx may still have made the instance."""
    if isinstance(exc, ProviderUnavailable):
        return exc.retry_after is not None
    return True


def _emit(ctx: context.Context, run: Run, kind: EventType, data: dict[str, object]) -> None:
    ctx.ledger.update_run(run.run_id, lambda r: [(kind, dict(data))])


def _start(ctx: context.Context, run: Run) -> list[Draft]:
    """Enter provision; decide the run's W&B run and announce it at once."""
    drafts = enter(run, Stage.PROVISION)
    planned = wandb_plan.plan(ctx.settings, job_spec(run), run.run_id, group=run.sweep_id)
    if planned is not None:
        run.progress["wandb"] = planned
        announced = {k: planned[k] for k in ("run_id", "project", "entity", "mode", "url")}
        drafts.append((EventType.WANDB_RUN, announced))
    return drafts


@app.task(name=Stage.PROVISION.task_name, bind=True, **RETRY_POLICY)
def provision(self: Task, run_id: str) -> None:
    """Bring up the run's node."""
    run_stage(self, run_id, Stage.PROVISION, step)
