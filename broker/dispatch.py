"""Handing a run from one short task to the next, with exactly one chain of tasks per run.

Each run has a tick key holding the id of the one task allowed to act on it next. A task claims the run
when it starts (the key is its id, or empty) and passes it on when it sends the next task (the key still
holds its own id). A redelivered or duplicate message finds another id there and stands down, so a
worker killed and restarted never doubles a run.

The claim is a lease: while a task holds its run (`hold`, around the whole task body), its claim is renewed
every third of `stall_after_s` for as long as the key still holds its id, so a step longer than that (a
large upload, an unpack) keeps the run. A task that dies stops renewing; its key expires `stall_after_s`
later and the reaper then sends a fresh task for any run that is not finished and has no owner. The claim
also fences the ledger (state.ledger.fenced): a task whose claim was taken over (it stalled past the TTL)
has its writes to the run refused with LeaseLost.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis
from celery import Celery

from broker.locks import Renewer
from broker.parking import WATCHER, Parking, Watch
from state.keys import PARKED, tick_key
from state.ledger import fenced
from state.stages import Stage

# KEYS[1] tick key; ARGV[1] expected owner ("" = anyone), ARGV[2] new owner, ARGV[3] ttl ms
_HANDOVER = """
local cur = redis.call('GET', KEYS[1])
if (not cur) or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""
# KEYS[1] tick key; ARGV[1] the owner that gives it back
_GIVE_BACK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
# KEYS[1] tick key, KEYS[2] PARKED; ARGV: WATCHER, the new owner, ttl ms, run id
_WAKE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('HDEL', KEYS[2], ARGV[4])
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""


class Dispatcher:
    """Sends stage tasks for runs while keeping one owner per run."""

    def __init__(self, app: Celery, client: redis.Redis[str], stall_after_s: float) -> None:
        self.app, self.client = app, client
        self.ttl_ms = int(stall_after_s * 1000)
        self._handover = client.register_script(_HANDOVER)
        self._wake = client.register_script(_WAKE)
        self._give_back = client.register_script(_GIVE_BACK)
        self.parking = Parking(client, self.ttl_ms)
        self._held: dict[tuple[str, str], Renewer] = {}  # the claims of tasks inside `hold`
        self._lock = threading.Lock()

    @contextmanager
    def hold(self, run_id: str, task_id: str) -> Iterator[None]:
        """The scope of a task's work on a run: once `claim` gave it the run, its claim is renewed until the
        scope ends (or the key is no longer its own), and the ledger's writes to the run are fenced by it."""
        renewer = Renewer(self.client, tick_key(run_id), task_id, self.ttl_ms)
        with self._lock:
            self._held[(run_id, task_id)] = renewer
        try:
            with fenced(run_id, task_id):
                yield
        finally:
            with self._lock:
                self._held.pop((run_id, task_id), None)
            renewer.stop()

    def claim(self, run_id: str, task_id: str) -> bool:
        """Called by a task as it starts: True if it may act on the run (renewed from then on, in `hold`)."""
        if not self._handover(keys=[tick_key(run_id)], args=[task_id, task_id, self.ttl_ms]):
            return False
        with self._lock:
            renewer = self._held.get((run_id, task_id))
        if renewer is not None:
            renewer.start()
        return True

    def wait(self, run_id: str, task_id: str, countdown: float) -> bool:
        """Keep the task's claim through a retry of itself `countdown` s away (its renewal ends here): else
        the claim would lapse while the retry waits and the reaper would send a second task. True if the
        task still owned the run."""
        with self._lock:
            renewer = self._held.get((run_id, task_id))
        if renewer is not None:
            renewer.stop()
        ttl = self.ttl_ms + int(countdown * 1000)
        return bool(self._handover(keys=[tick_key(run_id)], args=[task_id, task_id, ttl]))

    def send(self, stage: Stage, run_id: str, *, after: str | None, countdown: float = 0.0) -> bool:
        """Send `stage`'s task for the run if `after` (the sending task's id, or None) still owns it."""
        task_id = uuid.uuid4().hex
        ttl = self.ttl_ms + int(countdown * 1000)
        if not self._handover(keys=[tick_key(run_id)], args=[after or "", task_id, ttl]):
            return False
        self._send_task(stage, run_id, task_id, countdown)
        return True

    def kick(self, stage: Stage, run_id: str, record: Callable[[], bool]) -> bool:
        """Send `stage`'s task for a run that has no owner (the reaper's kick), its record written first:
        the run is claimed for the new task, then `record()` writes the kick to the ledger, and only then is
        the task sent. Sent first, the task could end the run before the kick was recorded, leaving a kick
        as the ended run's last event. When `record` declines (the run moved on meanwhile), the claim is
        given back and nothing is sent. Whether the task was sent."""
        task_id = uuid.uuid4().hex
        if not self._handover(keys=[tick_key(run_id)], args=["", task_id, self.ttl_ms]):
            return False
        if not record():
            self._give_back(keys=[tick_key(run_id)], args=[task_id])
            return False
        self._send_task(stage, run_id, task_id, 0.0)
        return True

    def take_over(self, run_id: str, who: str) -> str:
        """Take the run's claim from whatever task holds it, for `who` (the reaper, a budget stop) acting on
        the run itself: a task inside a long step on it has its next ledger write refused (LeaseLost). The
        claim's id; it expires as any claim does."""
        owner = f"{who}-{uuid.uuid4().hex}"
        self.client.set(tick_key(run_id), owner, px=self.ttl_ms)
        return owner

    def park(self, run_id: str, after: str, watch: Watch) -> bool:
        """Hand the run from task `after` to the watcher until `watch` comes (broker.parking). False when
        no watcher looks (the caller polls instead) or `after` no longer owns the run."""
        return self.parking.park(run_id, after, watch)

    def wake(self, stage: Stage, run_id: str) -> bool:
        """The watcher sends a parked run's stage task (if the run is still parked: one wake wins)."""
        task_id = uuid.uuid4().hex
        if not self._wake(keys=[tick_key(run_id), PARKED], args=[WATCHER, task_id, self.ttl_ms, run_id]):
            return False
        self._send_task(stage, run_id, task_id, 0.0)
        return True

    def _send_task(self, stage: Stage, run_id: str, task_id: str, countdown: float) -> None:
        self.app.send_task(
            stage.task_name, args=[run_id], queue=stage.value, task_id=task_id, countdown=countdown or None
        )

    def owner(self, run_id: str) -> str | None:
        value = self.client.get(tick_key(run_id))
        return None if value is None else str(value)
