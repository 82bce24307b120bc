"""The watcher: one loop for the fleet that looks at every parked run once a tick (broker.parking), so a run
that waits on its node costs no Celery task until something happens.

Every `fleet worker` runs a watcher thread; the one holding WATCHER_LEASE looks, the others wait to take
over. Each tick it renews the parked runs' claims (one script) and looks at each run in a pool of threads;
a run whose last look has not come back yet (a slow node) is not looked at again until it has, so one
slow node never holds up the others. A look reads:
- a Ray job the run waits for: the job's info; when the run trains, the trainer's new progress lines are
  relayed as events as the train task would (the same offset transaction, fenced by WATCHER's claim),
  and its info is asked only when its log stood still or said the job is done (one call a tick per
  node while it prints);
- instances it waits for: their states as the provider lists them (the shared list, providers.listing),
  and why a starting node's head does not answer its probe (a new cause is said at once: node.unreachable).
It sends the stage's task (`Dispatcher.wake`) when the job ended, a state changed, a look failed (the
stage's own error handling then sees it), or the Watch's deadline came. Nothing else acts on a parked
run without taking its claim first (a cancel wakes it; the reaper's dollar cap takes it over), so a look
needs the run itself only once, when it is parked: its node's client is kept until it wakes.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from broker.locks import Lease
from broker.parking import WATCHER, Watch
from core.errors import FleetError, LeaseLost, NotFound
from providers.node import NodeClient
from state.keys import WATCHER_LEASE
from state.ledger import fenced
from state.models import Run
from state.stages import STAGES, Stage
from workers import context, provision_reach
from workers.node_job import node

log = logging.getLogger("trainfleet.watcher")

Relay = Callable[[context.Context, Run, NodeClient, str], Run]

LOOKERS = 16  # parked runs looked at at once (their calls are mostly waiting on the network)
LEASE_TTL_S = 15.0  # a watcher that died is replaced this long after


@dataclass
class _Parked:
    """What the watcher keeps of a parked run between its looks."""

    watch: Watch
    run: Run
    client: NodeClient | None = None


class Watcher:
    """Looks at the parked runs while it holds the fleet's watcher lease."""

    def __init__(self, ctx: context.Context, holder: str) -> None:
        self.ctx, self.holder = ctx, holder
        self.parking = ctx.dispatcher.parking
        self._pool = ThreadPoolExecutor(LOOKERS, thread_name_prefix="fleet-watch")
        self._known: dict[str, _Parked] = {}
        self._looking: set[str] = set()
        self._lock = threading.Lock()

    def serve(self, stop: threading.Event) -> None:
        """Watch until `stop` is set: take the lease when it is free, look every tick while it is ours."""
        tick = self.ctx.settings.poll_interval_s
        while not stop.is_set():
            lease = Lease(self.ctx.redis, WATCHER_LEASE, LEASE_TTL_S, renew=True, holder=self.holder)
            try:
                if not lease.acquire():
                    stop.wait(min(LEASE_TTL_S / 3, 5.0))
                    continue
                log.info("watcher %s looks at the parked runs", self.holder)
                while not stop.is_set() and self.ctx.redis.get(WATCHER_LEASE) == lease.token:
                    began = time.monotonic()
                    self.tick()
                    stop.wait(max(0.0, tick - (time.monotonic() - began)))
            except Exception:  # Redis away, a bug: never end the loop; look again in a moment
                log.exception("watcher %s: a tick failed", self.holder)
                stop.wait(tick)
            finally:
                try:
                    lease.release()
                except Exception:  # noqa: BLE001 - its TTL lets it go
                    log.debug("watcher %s: lease not released", self.holder)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def tick(self) -> int:
        """Renew every parked run's claim and start a look at each one not being looked at; how many."""
        parked = self.parking.parked()
        for run_id in self.parking.renew(list(parked)):
            parked.pop(run_id, None)
        with self._lock:
            for run_id in set(self._known) - set(parked):
                del self._known[run_id]  # woken, or taken over
            due = [(r, w) for r, w in parked.items() if r not in self._looking]
            self._looking.update(r for r, _ in due)
        now = time.time()
        for run_id, watch in due:
            self._pool.submit(self._look, run_id, watch, now)
        return len(due)

    def _look(self, run_id: str, watch: Watch, now: float) -> None:
        try:
            if now >= watch.until or self._changed(run_id, watch):
                self.ctx.dispatcher.wake(watch.stage, run_id)
        finally:
            with self._lock:
                self._looking.discard(run_id)

    def _changed(self, run_id: str, watch: Watch) -> bool:
        try:
            known = self._known.get(run_id)
            if known is None or known.watch != watch:  # newly parked (or parked again, on another wait)
                known = _Parked(watch, self.ctx.ledger.get_run(run_id))
                with self._lock:
                    self._known[run_id] = known
            if known.run.state.is_terminal() or known.run.cancel_requested:
                return True  # its task ends it
            return self._job_ended(known) if watch.job else self._nodes_changed(known)
        except NotFound:
            self.parking.drop([run_id])
            return False
        except LeaseLost:
            return False  # woken meanwhile: its task has it
        except (FleetError, OSError) as exc:  # the stage's task sees it too, and handles it as it does
            log.info("run %s: look failed (%s); its %s task looks", run_id, exc, watch.stage)
            return True
        except Exception:
            log.exception("run %s: look crashed; its %s task looks", run_id, watch.stage)
            return True

    def _job_ended(self, known: _Parked) -> bool:
        job = known.watch.job
        assert job is not None
        if known.client is None:
            known.client = node(self.ctx, known.run)
        if known.watch.relay:
            relayed = self._relay(known, known.client, job)
            if relayed is not known.run:
                known.run = relayed
                if relayed.progress.done == job:
                    return True  # the trainer's last line: its stage goes on without waiting for its exit
                if not _said_done(relayed, known.watch):
                    return False  # it prints: it runs (its end is for a look at a log that stands still)
        info = known.client.info(job)
        ended = info is None or info.status.is_terminal()
        if ended and known.watch.relay:  # its last lines now, not after its task's turn in the queue
            known.run = self._relay(known, known.client, job)
        return ended

    def _relay(self, known: _Parked, client: NodeClient, job: str) -> Run:
        """The job's new lines as events, as its stage's task would relay them (under WATCHER's claim)."""
        with fenced(known.run.run_id, WATCHER):
            return relay_of(known.watch.stage)(self.ctx, known.run, client, job)

    def _nodes_changed(self, known: _Parked) -> bool:
        provider = self.ctx.provider(known.run.provider)
        starting = known.watch.stage == Stage.PROVISION
        for name, state in known.watch.nodes.items():
            found = provider.get(name)
            if found is None or found.look != state:  # its state, or the cause its head's probe meets
                if starting and found is not None and found.unanswered is not None:
                    # Said by the look that met it (once per cause: provision_reach), not a task's turn later.
                    with fenced(known.run.run_id, WATCHER):
                        known.run = provision_reach.note(self.ctx, known.run, {name: found})
                return True
        return False


def _said_done(run: Run, watch: Watch) -> bool:
    """Whether the job's relayed lines said it is done (the trainer's result, the fetch's FETCHED): its
    info is asked at once, not a tick later."""
    return run.progress.finished if watch.stage == Stage.TRAIN else run.progress.fetched == watch.job


def start_watcher(ctx: context.Context, holder: str) -> threading.Event:
    """Run a watcher in a daemon thread of this process; returns the event that stops it."""
    stop = threading.Event()
    watcher = Watcher(ctx, holder)
    threading.Thread(target=watcher.serve, args=(stop,), name="fleet-watcher", daemon=True).start()
    return stop


def relay_of(stage: Stage) -> Relay:
    """The stage's relay of its node job's lines as events, as printed: its module's `relay` (state.models
    STAGES names the module; looked up when used, so no import order can find it half made)."""
    relay: Relay = importlib.import_module(STAGES[stage].module).relay
    return relay
