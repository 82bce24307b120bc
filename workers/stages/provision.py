"""provision: find or create the run's node (intent first, lookup by name before any create), then
poll until its Ray head answers. A run on several nodes gets all of them, or none: node 0 runs the Ray
head, the others join its cluster, and the run goes on once the head lists every node; at the deadline, or
when one node fails, every one of them is terminated (teardown) and the run fails, saying which."""

from __future__ import annotations

import time
from typing import NoReturn

from celery import Task

from broker.app import app
from core.crashpoints import CrashPoint, crash_point
from core.errors import (
    FailureReason,
    FleetError,
    MachinesHeld,
    NoCapacity,
    NodeLost,
    ProviderError,
    StageFailed,
)
from jobs.paths import node_paths
from providers.base import LaunchRequest, NodeEndpoint, NodeInstance, NodeState, Provider
from providers.cluster import cluster_nodes, node_summary
from state.ledger import Draft
from state.models import Instance, InstanceState, Run
from state.payloads import (
    InstanceAdopted,
    InstanceReady,
    InstanceRequested,
    InstanceWaiting,
    NodeJoined,
    WandbRun,
)
from state.stages import RunState, Stage
from workers import budget, context, failover, provision_reach, readiness, spot, storage, wandb_plan
from workers.ending import instance_lost
from workers.node_job import node_software
from workers.node_secrets import node_secrets
from workers.runner import run_stage
from workers.stage import RETRY_POLICY, Next, enter

POOL_WAIT_S = 10.0
"""How often a run waiting for a pool's machine looks again (at most)."""


def step(ctx: context.Context, run: Run) -> Next:
    if run.state == RunState.QUEUED:
        # Out of the queue only within the caps (OVER_BUDGET before any node is asked for otherwise). One
        # cancelled meanwhile (queued, no worker had taken it: service.runs) stays cancelled.
        admitted = budget.admit(ctx, run, lambda r: _start(ctx, r))
        if admitted is None:  # another run is being checked against the caps: look again in a moment
            return Next.poll(Stage.PROVISION, ctx.settings.poll_interval_s)
        if (run := admitted).state.is_terminal():
            return Next.done()
    if run.spec.provider.is_choice:  # a `cloud:` job: this attempt's cloud and offer, chosen once
        try:
            run = failover.place(ctx, run)
        except MachinesHeld as exc:  # nothing to rent but a named pool's machines, held now: wait
            return _wait(ctx, run, str(exc))
        if run.placement is None:  # the run ended or moved on meanwhile: look again
            return Next.done() if run.state.is_terminal() else Next.poll(Stage.PROVISION, 0)
    provider = ctx.provider(run.provider)
    names = run.instance_names
    head = names[0]
    if run.instance != head:

        def attach(r: Run) -> list[Draft]:
            r.instance = head
            return []

        run = ctx.ledger.update_run(run.run_id, attach)
    # All or nothing: every node is asked for now (a worker once its head exists: it joins the head's
    # address); the run goes on when all are up and joined, or fails (terminating all) at the deadline.
    nodes: dict[str, NodeInstance] = {}
    for k, name in enumerate(names):
        if k > 0 and head not in nodes:
            break  # the workers join the head: they are asked for once it exists
        try:
            found = _bring_up(ctx, run, provider, name, k, head if k else None)
        except NoCapacity as exc:
            if isinstance(exc, MachinesHeld) and run.placement is None:  # the pool's machines are all held
                return _wait(ctx, run, str(exc))  # wait for one, said once (a `cloud:` job moves on)
            if exc.made_nothing and spot.may_leave(run):  # pod_type: auto: the same node, on demand
                spot.leave_now(ctx.ledger, run.run_id, name, f"no spot machine: {exc}")
                return Next.poll(Stage.PROVISION, 0)
            if run.placement is None or not exc.made_nothing:
                raise  # a job on one cloud waits for capacity there (the stage retries)
            failover.move_on(ctx, run, str(exc))  # a `cloud:` job tries its next offer
            return Next.poll(Stage.PROVISION, 0)
        if found is not None:
            nodes[name] = found
    for name, found in nodes.items():
        if found.state == NodeState.STOPPED:
            _stopped(ctx, run, found)
        if found.state == NodeState.FAILED:
            raise StageFailed(FailureReason.PROVISIONING_FAILED, f"instance {name}: {found.message}")
    up = [name for name in names if name in nodes and nodes[name].state == NodeState.RUNNING]
    endpoint = provider.endpoint(head) if head in up else None  # one lookup: only the head serves one
    for name in up:
        record = ctx.ledger.get_instance(name)
        if record is not None and record.state != InstanceState.RUNNING:
            url = endpoint.dashboard_url if endpoint is not None and name == head else None
            ctx.ledger.update_instance(name, state=InstanceState.RUNNING, dashboard_url=url)
    if endpoint is not None and len(up) == len(names):
        joined = len(names) == 1 or _joined(ctx, run, endpoint)
        if joined:  # up: the node is ready once its readiness check passes
            cluster = {"instances": names, "num_nodes": len(names)} if len(names) > 1 else {}
            ready = InstanceReady(instance=head, dashboard_url=endpoint.dashboard_url, **cluster)
            return readiness.check_node(ctx, run, head, endpoint, ready)
    run = provision_reach.note(ctx, run, nodes)  # why a head does not answer: each cause said once
    placed = run.placement
    started = placed.at if placed is not None else run.stage(Stage.PROVISION).started or run.created_at
    if run.progress.waiting is not None and (record := ctx.ledger.get_instance(head)) is not None:
        started = max(started, record.create_called_at or started)  # from when a pool's machine was had
    until = started + ctx.settings.node_ready_timeout_s
    given_up = provision_reach.given_up(ctx, run, nodes)
    if given_up is not None or time.time() > until:
        return _give_up(ctx, run, nodes, up, given_up)
    if len(nodes) == len(names) and len(up) < len(names):
        # Every node is listed and some are still starting: nothing to do until one's state (or the cause
        # its head's probe meets) changes, or a certificate's bound ends.
        looks = {name: found.look for name, found in nodes.items()}
        ends = provision_reach.gives_up_at(ctx, run, nodes)
        return Next.wait_nodes(ctx, Stage.PROVISION, looks, min(until, ends or until))
    return Next.poll(Stage.PROVISION, ctx.settings.poll_interval_s)


def _wait(ctx: context.Context, run: Run, why: str) -> Next:
    """Wait in provision for a machine of the run's pool, looking again every few polls; what it waits on
    is said when it changes (another run holds the machine now)."""
    if run.progress.waiting != why:

        def note(r: Run) -> list[Draft]:
            if r.progress.waiting == why:
                return []
            r.progress.waiting = why
            return [InstanceWaiting(why=why)]

        ctx.ledger.update_run(run.run_id, note)
    return Next.poll(Stage.PROVISION, min(POOL_WAIT_S, 10 * ctx.settings.poll_interval_s))


def _give_up(
    ctx: context.Context, run: Run, nodes: dict[str, NodeInstance], up: list[str], unreachable: str | None
) -> Next:
    """The nodes are not ready in time, or cannot be reached (`unreachable`: why): a `cloud:` job moves on
    to its next offer; any other fails NODE_UNREACHABLE or NODE_TIMEOUT, saying why."""
    names = run.instance_names
    late = [name for name in names if name not in up]
    if unreachable is not None:
        why = unreachable
    else:
        what = f"instance {', '.join(late)}" if late else "the cluster's nodes"
        why = f"{what} not ready after {ctx.settings.node_ready_timeout_s:.0f} s"
        if len(names) > 1:
            joined_now = len(run.progress.cluster)
            why += f" ({len(up)} of {len(names)} instances up, {joined_now} Ray nodes joined)"
        if said := provision_reach.last_words(run, nodes, late):  # the cause it waited out in vain
            why += f"; {said}"
    if run.placement is not None:  # a `cloud:` job tries its next offer
        failover.move_on(ctx, run, why)
        return Next.poll(Stage.PROVISION, 0)
    if unreachable is not None:
        raise StageFailed(FailureReason.NODE_UNREACHABLE, why)
    if advice := run.spec.section.start_advice():
        why += f"; {advice}"
    raise StageFailed(FailureReason.NODE_TIMEOUT, why)


def _stopped(ctx: context.Context, run: Run, found: NodeInstance) -> NoReturn:
    """A node of the run (`found`) stopped while the run waited for it. One that had come up was preempted:
    it is replaced. One that stopped before it came up was outbid, or its cloud could not start it: an image
    that cannot be pulled, a container that exits at once (RunPod stops such a pod and says neither). An
    on-demand machine is never outbid, and a second spot machine stopping before it came up is unlikely to
    be chance: the run fails, saying what to check, rather than renting the same failure again (up to
    max_preemptions); a `pod_type: auto` run goes on on demand instead (workers.spot)."""
    why = f"instance {found.name}: {found.message}"
    record = ctx.ledger.get_instance(found.name)
    if record is not None and record.state == InstanceState.RUNNING:
        raise NodeLost(why)
    on_spot = spot.on_spot(run)
    if on_spot and (run.boot_losses == 0 or spot.may_leave(run)):  # auto: the next one on demand
        raise NodeLost(f"{why}, before it came up", at_boot=True)
    which = "the second spot machine to stop" if on_spot else "an on-demand machine, never outbid, stopped"
    check = "that its image exists and can be pulled (a private image needs registry credentials)"
    if on_spot:
        check += ", and that max_bid_per_gpu is not below the market"
    raise StageFailed(
        FailureReason.PROVISIONING_FAILED,
        f"{why}: {which} before it came up, so its cloud could not start it; check {check}",
    )


def _bring_up(
    ctx: context.Context, run: Run, provider: Provider, name: str, k: int, head: str | None
) -> NodeInstance | None:
    """Find or create instance `name` (node `k`; `head`: the instance whose cluster it joins). None while
    it cannot be known yet: a create call without a clear answer may still show, a listing may lag."""
    record = ctx.ledger.get_instance(name)
    if record is None:
        # The intent is written before the create call, so a crash in between leaves a name to look up.
        record = Instance(name=name, provider=run.provider, run_id=run.run_id, head=head)
        ctx.ledger.put_instance(record)
    found = provider.get(name)
    if found is None and record.state != InstanceState.REQUESTED:
        # Created, but not listed (now): lists lag, so it is lost only after several looks in a row;
        # never created again under this name.
        if (lost := instance_lost(ctx, run, name)) is not None:
            raise NodeLost(f"{lost} while starting")
        return None
    if found is None:
        called = record.create_called_at
        if called is not None and time.time() - called < ctx.settings.create_settle_s:
            # An earlier create call had no clear answer (a timeout, a 5xx): the vendor may still carry
            # it out. Look it up by name until it has had time to show, rather than create a second one.
            return None
        section = run.node_section(
            k
        )  # the head may have its own shape; a `cloud:` job's, its offer's cloud's
        request = LaunchRequest(
            name,
            run.run_id,
            section,
            node_secrets(ctx, run),
            heartbeat_timeout_s=ctx.settings.node_heartbeat_timeout_s,
            head=head,
            software=node_software(ctx, run),
            offer=run.placement.offer if run.placement is not None else None,
            local_paths=node_paths(run.spec.train),
            volume=storage.volume_for(ctx, run, provider, section, name),
        )
        ctx.ledger.update_instance(name, create_called_at=time.time())
        try:
            found = provider.launch(request)
        except ProviderError as exc:
            if exc.made_nothing:  # a clear no, or no create was asked: a create may be asked again now
                ctx.ledger.update_instance(name, create_called_at=None)
            raise
        crash_point(CrashPoint.AFTER_CREATE_CALL)
        ctx.ledger.update_instance(
            name,
            state=InstanceState.STARTING,
            provider_id=found.provider_id,
            price_per_hour=found.price_per_hour,
        )
        node = {"node": k, "num_nodes": run.num_nodes} if run.num_nodes > 1 else {}
        _emit(
            ctx,
            run,
            InstanceRequested(
                instance=name, provider=run.provider, price_per_hour=found.price_per_hour, **node
            ),
        )
    elif record.state == InstanceState.REQUESTED:
        ctx.ledger.update_instance(name, state=InstanceState.STARTING, provider_id=found.provider_id)
        _emit(ctx, run, InstanceAdopted(instance=name, provider=run.provider))
    return found


def _joined(ctx: context.Context, run: Run, endpoint: NodeEndpoint) -> bool:
    """Whether every node has joined the head's Ray cluster, as the head's State API lists them (ALIVE);
    each node's arrival is an event, once."""
    try:
        alive = [n for n in cluster_nodes(endpoint) if n.state == "ALIVE"]
    except FleetError:
        return False  # the head's State API is not up yet: ask again at the next poll
    known = list(run.progress.cluster)
    new = [n for n in alive if n.node_id not in known]
    if new:

        def note(r: Run) -> list[Draft]:
            seen = list(r.progress.cluster)
            drafts: list[Draft] = []
            for n in new:
                if n.node_id in seen:
                    continue
                seen.append(str(n.node_id))
                drafts.append(NodeJoined(**node_summary(n), nodes=len(seen), of=r.num_nodes))
            r.progress.cluster = seen
            return drafts

        ctx.ledger.update_run(run.run_id, note)
    return len(alive) >= run.num_nodes


def _emit(ctx: context.Context, run: Run, payload: Draft) -> None:
    ctx.ledger.update_run(run.run_id, lambda r: [payload])


def _start(ctx: context.Context, run: Run) -> list[Draft]:
    """Enter provision (a run still queued only); decide the run's W&B run and announce it at once."""
    if run.state != RunState.QUEUED:
        return []
    drafts = enter(run, Stage.PROVISION)
    planned = wandb_plan.plan(ctx.settings, run.spec, run.run_id, group=run.sweep_id)
    if planned is not None:
        run.progress.wandb = planned
        announced = WandbRun(
            run_id=planned.run_id,
            project=planned.project,
            entity=planned.entity,
            mode=planned.mode,
            url=planned.url,
        )
        drafts.append(announced)
    return drafts


@app.task(name=Stage.PROVISION.task_name, bind=True, **RETRY_POLICY)
def provision(self: Task, run_id: str) -> None:
    """Bring up the run's node."""
    run_stage(self, run_id, Stage.PROVISION, step)
