"""reap (celery beat): one reaper at a time reconciles the ledger with each provider's live list.

- A live instance of ours whose run is finished (or unknown), older than the grace window: terminate.
- A ledger instance in TERMINATING: terminate again until the provider no longer lists it.
- A run that is not finished and whose task chain died (no owner): send its stage task again.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable

from broker.app import app
from broker.constants import REAP_LOCK, REAP_TASK, Stage
from broker.events import new_event
from broker.ledger import Draft
from broker.models import EventType, InstanceState, Run
from fleet.errors import FleetError, NotFound
from providers.base import INSTANCE_PREFIX, Provider
from providers.registry import configured_providers
from workers import context

log = logging.getLogger("trainfleet.reap")


def reap_once(ctx: context.Context) -> dict[str, list[str]]:
    """One reconciliation pass; returns what it did (also emitted as events)."""
    did: dict[str, list[str]] = {"terminated": [], "confirmed": [], "kicked": []}
    owner = f"{socket.gethostname()}:{os.getpid()}"
    lock_ttl = max(10, int(ctx.settings.reap_interval_s * 2))
    if not ctx.redis.set(REAP_LOCK, owner, nx=True, ex=lock_ttl):
        return did
    try:
        for provider in configured_providers(ctx.provider_context):
            try:
                _reconcile(ctx, provider, did)
            except FleetError as exc:  # one cloud's outage must not stop the others' reaping
                log.warning("reap: %s skipped this pass: %s", provider.name.value, exc)
        for run in ctx.ledger.list_runs(limit=500):
            stage = run.state.stage
            # A run with no owner lost its chain of tasks (a worker died): send its stage task again.
            if stage is not None and ctx.dispatcher.send(stage, run.run_id, after=None):
                did["kicked"].append(run.run_id)
                ctx.ledger.update_run(run.run_id, _kicked_event(stage))
    finally:
        if ctx.redis.get(REAP_LOCK) == owner:
            ctx.redis.delete(REAP_LOCK)
    return did


def _reconcile(ctx: context.Context, provider: Provider, did: dict[str, list[str]]) -> None:
    """Terminate the provider's orphans past the grace window; confirm what is TERMINATING."""
    live = {inst.name: inst for inst in provider.list_instances()}
    for inst_name, inst in live.items():
        if not inst_name.startswith(INSTANCE_PREFIX):
            continue
        record = ctx.ledger.get_instance(inst_name)
        # A provider may date an instance from when it started running (RunPod's uptime), so one stuck
        # before that looks new for ever; the ledger's record of our create call is the older witness.
        age = max(inst.age_s, time.time() - record.created_at) if record is not None else inst.age_s
        if age < ctx.settings.orphan_grace_s:
            continue
        if record is not None and record.keep_until is not None and record.keep_until > time.time():
            continue  # kept for debugging until its deadline
        active = False
        if record is not None:
            try:
                active = not ctx.ledger.get_run(record.run_id).state.is_terminal()
            except NotFound:
                active = False
        if not active:
            provider.terminate(inst_name)
            did["terminated"].append(inst_name)
            ctx.ledger.emit(new_event(EventType.REAP_TERMINATED, {"instance": inst_name, "why": "orphan"}))
    for record in ctx.ledger.list_instances():
        if record.provider != provider.name.value or record.state != InstanceState.TERMINATING:
            continue
        if record.name in live:
            provider.terminate(record.name)
        else:
            ctx.ledger.update_instance(record.name, state=InstanceState.TERMINATED)
            did["confirmed"].append(record.name)


def _kicked_event(stage: Stage) -> Callable[[Run], list[Draft]]:
    return lambda _run: [(EventType.RUN_KICKED, {"stage": stage.value})]


@app.task(name=REAP_TASK)
def reap() -> None:
    """The periodic reaper."""
    did = reap_once(context.get())
    if any(did.values()):
        log.info("reap: %s", did)
