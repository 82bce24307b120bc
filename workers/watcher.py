"""The watcher: one loop for the fleet that looks at every parked run once a tick (broker.parking), so a run
that waits on its node costs no Celery task until something happens.

Every `fleet worker` runs a watcher thread; the one holding WATCHER_LEASE looks, the others wait to take
over. Each tick it renews the parked runs' claims and looks at each run (a pool of threads, one node's
calls in one thread):
- a Ray job it waits for: the job's info; when the run trains, the trainer's new progress lines are
  relayed as events as the train task would (the same offset transaction, fenced by WATCHER's claim);
- instances it waits for: their states as the provider lists them (the shared list, providers.listing).
It sends the stage's task (`Dispatcher.wake`) when the job ended, a state changed, a look failed (the
stage's own error handling then sees it), the run was cancelled or moved on, or the Watch's deadline came.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from broker.constants import WATCHER_LEASE
from broker.ledger import fenced
from broker.locks import Lease
from broker.models import Run
from broker.parking import WATCHER, Watch
from core.errors import FleetError, LeaseLost
from workers import context
from workers.node_job import node
from workers.train import relay

log = logging.getLogger("trainfleet.watcher")

LOOKERS = 16  # parked runs looked at at once (their calls are mostly waiting on the network)
LEASE_TTL_S = 15.0  # a watcher that died is replaced this long after


class Watcher:
    """Looks at the parked runs while it holds the fleet's watcher lease."""

    def __init__(self, ctx: context.Context, holder: str) -> None:
        self.ctx, self.holder = ctx, holder
        self.parking = ctx.dispatcher.parking
        self._providers = threading.Lock()  # a provider object serves one caller at a time
        self._pool = ThreadPoolExecutor(LOOKERS, thread_name_prefix="fleet-watch")

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
        """One look at every parked run; the number of runs woken."""
        parked = self.parking.parked()
        for run_id in self.parking.renew(list(parked)):
            parked.pop(run_id, None)
        if not parked:
            return 0
        runs = self.ctx.ledger.get_runs(list(parked))
        now = time.time()
        looks = [self._pool.submit(self._look, runs.get(r), r, watch, now) for r, watch in parked.items()]
        return sum(1 for look in looks if look.result())

    def _look(self, run: Run | None, run_id: str, watch: Watch, now: float) -> bool:
        if run is None or run.state.is_terminal():
            self.parking.drop([run_id])
            return False
        try:
            due = run.cancel_requested or run.state.stage != watch.stage or now >= watch.until
            if not due:
                due = self._job_ended(run, watch) if watch.job else self._nodes_changed(run, watch)
        except LeaseLost:
            return False  # woken meanwhile: its task has it
        except (FleetError, OSError) as exc:  # the stage's task sees it too, and handles it as it does
            log.info("run %s: look failed (%s); its %s task looks", run_id, exc, watch.stage)
            due = True
        except Exception:
            log.exception("run %s: look crashed; its %s task looks", run_id, watch.stage)
            due = True
        return due and self.ctx.dispatcher.wake(watch.stage, run_id)

    def _job_ended(self, run: Run, watch: Watch) -> bool:
        assert watch.job is not None
        client = node(self.ctx, run)
        info = client.info(watch.job)  # before the log, so a finished job's log is read whole
        if watch.relay:
            with fenced(run.run_id, WATCHER):
                relay(self.ctx, run, client, watch.job)
        return info is None or info.status.is_terminal()

    def _nodes_changed(self, run: Run, watch: Watch) -> bool:
        provider = self.ctx.provider(run.provider)
        with self._providers:
            for name, state in watch.nodes.items():
                found = provider.get(name)
                if found is None or found.state.value != state:
                    return True
        return False


def start_watcher(ctx: context.Context, holder: str) -> threading.Event:
    """Run a watcher in a daemon thread of this process; returns the event that stops it."""
    stop = threading.Event()
    watcher = Watcher(ctx, holder)
    threading.Thread(target=watcher.serve, args=(stop,), name="fleet-watcher", daemon=True).start()
    return stop
