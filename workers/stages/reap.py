"""reap (celery beat, every reap_interval_s): one reaper at a time reconciles the ledger with each
provider's live list, so that no paid node is left behind. Only instances named tf-... are ever touched.

For each live instance of ours, older than the grace window (by the provider's age or the ledger's record
of the create call, whichever is older):

- no ledger record, or its run is unknown: an orphan (a crash between the create call and the ledger
  write, or a ledger lost): terminated.
- past its job's `terminate_after` from its start: terminated; a run still on it fails DEADLINE.
- its run is still going: in use; nothing to do.
- kept for debugging (one_shot: false, run failed): a reminder event `kept_reminder_s` before its
  deadline, terminated at it.
- its run ended and the job is not one_shot: idle from the run's end (a GPU busier than
  idle_gpu_util_pct, where the provider reports it, makes it busy again). Announced once, terminated
  `stop_after` seconds later by a pass sent for that moment (`reap_at`; the periodic pass is the safety
  net), not up to a reap interval late.
- its run ended and the job is one_shot: the stage that should have ended it did not (a crash):
  terminated.

A terminate is retried, with back-off, until the provider stops listing the instance; only then is it
TERMINATED. One still listed `stuck_alert_after_s` after its first terminate raises an alert event every
cycle. A ledger instance the provider does not list is LOST only after `lost_after_misses` looks in a
row (lists lag), and nothing is ever created again because of that.

The nodes of a run's cluster (tf-<run>-<attempt>-<k>) share their run, job and lifetime, so these rules
end them together.

Then the money (workers.budget): a run whose nodes cost `max_dollars_per_run`, or that spends while the
fleet's day cap or its submitter's is spent, is stopped OVER_BUDGET (its stage task fenced off, even while a
long step runs; its checkpoint brought back first). Then each unfinished run whose task chain died (no
owner) gets its stage task sent again, unless tasks sent so kept dying without ending a step
(`stalled_after_kicks`): then it fails STALLED, saying so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from celery import Task
from pydantic import ValidationError

from broker import sweeps
from broker.app import app
from broker.locks import Lease
from broker.queues import REAP_AT_TASK, REAP_TASK
from core.errors import FailureReason, FleetError, NotFound
from jobs.spec import JobSpec
from providers.base import INSTANCE_PREFIX, NodeInstance, Provider
from providers.node import ping
from state.events import new_event
from state.keys import REAP_LOCK, REAP_SEEN
from state.ledger import Draft
from state.models import Instance, InstanceState, Run
from state.payloads import (
    InstanceIdle,
    InstanceLost,
    InstanceReminder,
    InstanceStuck,
    InstanceTerminated,
    Payload,
    ReapTerminated,
    RunKicked,
)
from state.stages import RunState, Stage
from workers import budget, context
from workers.ending import teardown

log = logging.getLogger("trainfleet.reap")
DEADLINE_MARGIN_S = 0.5  # a deadline's pass comes this much after it, so that the clock has passed it


@dataclass
class Report:
    """What one pass did, by instance or run name (each is also an event)."""

    terminated: list[str] = field(default_factory=list)  # asked to terminate for the first time
    retried: list[str] = field(default_factory=list)  # asked again: still listed
    confirmed: list[str] = field(default_factory=list)  # gone from the provider's list: TERMINATED
    stuck: list[str] = field(default_factory=list)  # alerts: still listed long after the terminate
    idle: list[str] = field(default_factory=list)  # announced idle
    reminded: list[str] = field(default_factory=list)  # kept instances about to end
    lost: list[str] = field(default_factory=list)  # not listed several looks in a row: LOST
    failed: list[str] = field(default_factory=list)  # runs failed because their node hit its deadline
    kicked: list[str] = field(default_factory=list)  # runs whose stage task was sent again
    over_budget: list[str] = field(default_factory=list)  # runs failed at the per-run dollar cap
    stalled: list[str] = field(default_factory=list)  # runs failed: their re-sent tasks kept dying
    released: list[str] = field(default_factory=list)  # sweep children given a free slot

    def any(self) -> bool:
        return any(vars(self).values())


def reap_once(ctx: context.Context) -> Report | None:
    """One reconciliation pass; None when another reaper holds the lock."""
    # Renewed while the pass runs (a provider call may hang until its timeout); a reaper that dies stops
    # renewing, and the next pass after its lock expired reaps in its place.
    lease = Lease(
        ctx.redis,
        REAP_LOCK,
        max(10.0, ctx.settings.reap_interval_s * 2),
        renew=True,
        holder=f"{socket.gethostname()}:{os.getpid()}",
    )
    if not lease.acquire():
        return None
    report = Report()
    try:
        for provider in ctx.world.configured():
            try:
                Pass(ctx, provider, report).run()
            except FleetError as exc:  # one cloud's outage must not stop the others' reaping
                log.warning("reap: %s skipped this pass: %s", provider.name.value, exc)
        report.over_budget += budget.enforce(ctx)
        for run in ctx.ledger.list_runs(limit=500):
            if not run.state.is_terminal():
                _unfinished(ctx, run, report)
        for sweep_id in ctx.ledger.active_sweeps():  # a slot freed while its advance failed, or a crash
            report.released += sweeps.advance(ctx.ledger, ctx.dispatcher, sweep_id)
    finally:
        lease.release()
    return report


class Pass:
    """One provider's part of a reaper pass."""

    def __init__(self, ctx: context.Context, provider: Provider, report: Report) -> None:
        self.ctx, self.provider, self.report = ctx, provider, report
        self.settings = ctx.settings
        self.now = time.time()
        self.records: dict[str, Instance] = {}

    def run(self) -> None:
        live = {i.name: i for i in self.provider.list_instances() if i.name.startswith(INSTANCE_PREFIX)}
        records = {
            r.name: r for r in self.ctx.ledger.list_instances() if r.provider == self.provider.name.value
        }
        self.records = records
        for name, inst in live.items():
            try:
                self.judge(inst, records.get(name))
            except FleetError as exc:  # a failed call for one instance must not spare the others
                log.warning("reap: %s: %s", name, exc)
        for name, record in records.items():
            if name not in live:
                self.unlisted(record)

    # live instances -------------------------------------------------------------------------------
    def judge(self, inst: NodeInstance, record: Instance | None) -> None:
        if record is not None and record.missed:
            record = self.ctx.ledger.update_instance(record.name, missed=0) or record
        if record is not None and record.state == InstanceState.TERMINATING:
            self.retry(inst, record)
            return
        if record is not None and record.state in _SETTLED:  # listed again after all: end it
            self.terminate(inst.name, record, f"listed again after it was {record.state.value}")
            return
        age = inst.age_s if record is None else max(inst.age_s, self.now - record.created_at)
        if age < self.settings.orphan_grace_s:
            return
        run = self._run(record)
        if record is None or run is None:
            self.terminate(inst.name, record, "orphan")
            return
        try:
            spec = run.spec
        except ValidationError:  # cannot happen to a run the fleet stored; never let it stop reaping
            log.error("reap: run %s has an unreadable job; its node is ended with the run", run.run_id)
            if run.state.is_terminal():
                self.terminate(inst.name, record, "run ended")
            return
        lifetime = spec.section.terminate_after
        if lifetime != -1 and self.now >= record.created_at + lifetime:
            self.deadline(inst, record, run, lifetime)
            return
        if not run.state.is_terminal() and inst.name not in run.instance_names:
            self.terminate(inst.name, record, "replaced")  # a node the run left (it was lost, preempted)
            return
        if not run.state.is_terminal():
            if record.idle_since is not None:
                self.ctx.ledger.update_instance(inst.name, idle_since=None)
            self.heartbeat(inst.name)
            return
        if record.keep_until is not None:
            self.kept(inst, record, run)
        elif not spec.one_shot:
            self.idle(inst, record, run, spec)
        else:
            self.terminate(inst.name, record, "run ended")  # the stage that should have did not

    def deadline(self, inst: NodeInstance, record: Instance, run: Run, lifetime: int) -> None:
        """terminate_after reached: end the node, and the run on it if it is still going."""
        why = f"the node reached terminate_after ({lifetime} s)"
        if not run.state.is_terminal() and run.instance and inst.name in run.instance_names:
            teardown(self.ctx, run, RunState.FAILED, FailureReason.DEADLINE, why, keep=False)
            self.report.failed.append(run.run_id)
            record = self.ctx.ledger.get_instance(inst.name) or record
            if record.state != InstanceState.RUNNING:
                return  # teardown asked for the terminate; the next passes confirm or retry it
        self.terminate(inst.name, record, "deadline")

    def kept(self, inst: NodeInstance, record: Instance, run: Run) -> None:
        until = record.keep_until
        assert until is not None
        if self.now >= until:
            self.terminate(inst.name, record, "kept until its deadline")
            return
        self.heartbeat(inst.name)  # kept alive on purpose: its own failsafe must not end it early
        if not record.reminded and self.now >= until - self.settings.kept_reminder_s:
            self.ctx.ledger.update_instance(inst.name, reminded=True)
            reminder = InstanceReminder(instance=inst.name, until=until, in_s=round(until - self.now))
            self._event(reminder, run.run_id)
            self.report.reminded.append(inst.name)

    def idle(self, inst: NodeInstance, record: Instance, run: Run, spec: JobSpec) -> None:
        """No active run on it: announce, then terminate once it has been idle for stop_after."""
        busy = inst.gpu_util is not None and inst.gpu_util > self.settings.idle_gpu_util_pct
        if busy:
            if record.idle_since is not None:
                self.ctx.ledger.update_instance(inst.name, idle_since=None)
            self.heartbeat(inst.name)
            return
        stop_after = int(getattr(spec.section, "stop_after", self.settings.idle_stop_after_s))
        if stop_after == -1:
            self.heartbeat(inst.name)  # never idle: only terminate_after ends it
            return
        since = record.idle_since
        if since is None:
            since = max(run.updated_at, record.created_at)
            self.ctx.ledger.update_instance(inst.name, idle_since=since)
            idle = InstanceIdle(instance=inst.name, idle_since=since, terminate_at=since + stop_after)
            self._event(idle, run.run_id)
            self.report.idle.append(inst.name)
            # A pass at the deadline, so that the node ends then, not at the next periodic pass (which
            # stays the safety net should this task be lost).
            reap_at.apply_async(countdown=max(0.0, since + stop_after - time.time()) + DEADLINE_MARGIN_S)
        if self.now >= since + stop_after:
            self.terminate(inst.name, record, f"idle for {round(self.now - since)} s")
        else:
            self.heartbeat(inst.name)  # the job gave it stop_after: its own failsafe must not cut that

    def heartbeat(self, name: str) -> None:
        """Tell a node in use that the fleet is alive (its failsafe ends it when nobody calls for
        FLEET_NODE_HEARTBEAT_TIMEOUT_S; the stages' polls count too, this covers the quiet times)."""
        if (record := self.records.get(name)) is not None and record.head is not None:
            return  # a cluster's worker node serves no Jobs API: its failsafe watches its head instead
        if self.settings.node_heartbeat_timeout_s:
            with contextlib.suppress(FleetError):  # no head to reach yet (starting): nothing to tell
                ping(self.provider.endpoint_at(name, record.dashboard_url if record is not None else None))

    def terminate(self, name: str, record: Instance | None, why: str) -> None:
        """The first terminate call for this instance (recorded, so that it is retried until gone)."""
        if record is None:  # an orphan the ledger never knew: record it, to follow it until it is gone
            record = Instance(name=name, provider=self.provider.name.value, run_id="")
            self.ctx.ledger.put_instance(record)
        run_id = record.run_id or None
        self.ctx.ledger.update_instance(
            name, state=InstanceState.TERMINATING, why_terminated=why, terminate_requested_at=self.now
        )
        self._event(ReapTerminated(instance=name, why=why), run_id)
        self.report.terminated.append(name)
        self._call_terminate(name, 0)

    def retry(self, inst: NodeInstance, record: Instance) -> None:
        """Still listed after a terminate: call again when its back-off allows; alert when it has been
        long."""
        since = record.terminate_requested_at or record.updated_at
        if self.now - since >= self.settings.stuck_alert_after_s:
            stuck = InstanceStuck(
                instance=record.name,
                since=since,
                attempts=record.terminate_attempts,
                price_per_hour=inst.price_per_hour or record.price_per_hour,
                provider_id=inst.provider_id,
            )
            self._event(stuck, record.run_id or None)
            self.report.stuck.append(record.name)
            log.error(
                "reap: %s (%s id %s) still listed %.0f s after it was terminated; terminate it by hand "
                "if this goes on",
                record.name,
                self.provider.name.value,
                inst.provider_id,
                self.now - since,
            )
        if self.now >= record.next_terminate_at:
            self.report.retried.append(record.name)
            self._call_terminate(record.name, record.terminate_attempts)

    def _call_terminate(self, name: str, attempts: int) -> None:
        """Call terminate. The calls after it come 1, 2, 4, ... reap passes apart (each wait is half a
        pass short of that, so that a pass a little early still counts), up to terminate_retry_max_s."""
        passes = 2**attempts - 0.5
        wait = min(self.settings.reap_interval_s * passes, self.settings.terminate_retry_max_s)
        self.ctx.ledger.update_instance(
            name, terminate_attempts=attempts + 1, next_terminate_at=self.now + wait
        )
        self.provider.terminate(name)

    # ledger instances the provider does not list ----------------------------------------------------
    def unlisted(self, record: Instance) -> None:
        if record.state == InstanceState.TERMINATING:
            self.provider.forget(record.name)
            ended = self.ctx.ledger.update_instance(
                record.name, InstanceState.TERMINATING, state=InstanceState.TERMINATED
            )
            if ended is None:  # its run's stage confirmed it since this pass listed it, and said so
                return
            self.report.confirmed.append(record.name)
            self._event(InstanceTerminated(instance=record.name), record.run_id or None)
            return
        if record.state not in (InstanceState.STARTING, InstanceState.RUNNING):
            return  # REQUESTED: maybe never created (the provision stage looks it up by name)
        missed = record.missed + 1
        if missed < self.settings.lost_after_misses:
            self.ctx.ledger.update_instance(record.name, missed=missed)
            return
        self.ctx.ledger.update_instance(record.name, missed=missed, state=InstanceState.LOST)
        self._event(InstanceLost(instance=record.name, looks=missed), record.run_id or None)
        self.report.lost.append(record.name)

    # helpers ----------------------------------------------------------------------------------------
    def _run(self, record: Instance | None) -> Run | None:
        if record is None or not record.run_id:
            return None
        try:
            return self.ctx.ledger.get_run(record.run_id)
        except NotFound:
            return None

    def _event(self, payload: Payload, run_id: str | None) -> None:
        self.ctx.ledger.emit(new_event(payload, run_id))


_SETTLED = (InstanceState.TERMINATED, InstanceState.LOST)  # ...and yet listed: terminate it again


def _unfinished(ctx: context.Context, run: Run, report: Report) -> None:
    """The kick of a run whose chain of tasks died (a worker died, a task was killed at its hard time
    limit), within its bound."""
    stage = run.state.stage
    if stage is None or run.held or ctx.dispatcher.owner(run.run_id) is not None:
        return
    bound = ctx.settings.stalled_after_kicks
    if run.kicked_starts >= bound:
        why = (
            f"its {stage.value} task was re-sent {run.kicks} times after its chain of tasks died, and "
            f"{run.kicked_starts} of them started and died without ending a step (FLEET_STALLED_AFTER_KICKS="
            f"{bound}): killed at its hard time limit, or its worker crashed; see the worker's log"
        )
        teardown(ctx, run, RunState.FAILED, FailureReason.STALLED, why, keep=False)
        report.stalled.append(run.run_id)
        return

    # A run with no owner lost its chain of tasks (a worker died): send its stage task again.
    def record() -> bool:
        return ctx.ledger.update_run(run.run_id, kick_record(stage, bound)).kicks > run.kicks

    if ctx.dispatcher.kick(stage, run.run_id, record):
        report.kicked.append(run.run_id)


def kick_record(stage: Stage, bound: int) -> Callable[[Run], list[Draft]]:
    """The kick's record, written before its task is sent (Dispatcher.kick) and only while the run is still
    in that stage: another process may have ended the run (a cancel) or moved it on since it was read."""

    def kicked(run: Run) -> list[Draft]:
        if run.state.stage is not stage:
            return []
        run.kicks += 1
        return [RunKicked(stage=stage, kick=run.kicks, stalled_after=bound)]

    return kicked


@app.task(name=REAP_AT_TASK, bind=True, max_retries=120)
def reap_at(self: Task) -> None:
    """A reaper pass sent for a deadline; when another pass holds the lock, again a moment later."""
    report = reap_once(context.get())
    if report is None:
        raise self.retry(countdown=1.0)
    if report.any():
        log.info("reap at a deadline: %s", {k: v for k, v in vars(report).items() if v})


@app.task(name=REAP_TASK)
def reap() -> None:
    """The periodic reaper. Its start is recorded (REAP_SEEN): `fleet health beat` reads it."""
    ctx = context.get()
    ctx.redis.set(REAP_SEEN, f"{time.time():.3f}")
    report = reap_once(ctx)
    if report is not None and report.any():
        log.info("reap: %s", {k: v for k, v in vars(report).items() if v})
