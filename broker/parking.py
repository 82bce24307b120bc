"""Runs parked on what they wait for, instead of a stage task every poll interval.

A stage step that can only wait (a Ray job running on the node, instances booting) says what it waits for
(a `Watch`): the run's tick key passes from its task to WATCHER and the Watch is recorded under PARKED.
The watcher (workers.watcher: one at a time in the fleet, holding WATCHER_LEASE) looks at every parked run
once a tick, relays what needs no task (the trainer's progress lines), and sends the stage task only when
something changed, the run needs attention (a cancel), or the Watch's deadline passed.

The tick key stays the run's one owner throughout: the watcher renews the parked runs' keys every tick.
A watcher that dies stops renewing; the keys expire `stall_after_s` later and the reaper kicks those runs
as it kicks any run without an owner. A step parks only while a watcher holds the lease; else it polls.
"""

from __future__ import annotations

import redis
from pydantic import BaseModel, ConfigDict

from state.keys import PARKED, WATCHER_LEASE, tick_key
from state.stages import Stage

WATCHER = "watcher"  # a parked run's tick key holds this, not a task's id

# KEYS[1] tick key, KEYS[2] PARKED, KEYS[3] WATCHER_LEASE; ARGV: expected owner, WATCHER, ttl ms, run id,
# the Watch as JSON. Parks only while a watcher holds the lease.
_PARK = """
if redis.call('EXISTS', KEYS[3]) == 1 and redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.call('HSET', KEYS[2], ARGV[4], ARGV[5])
  return 1
end
return 0
"""
# KEYS: tick keys; ARGV[1] WATCHER, ARGV[2] ttl ms: renews those still WATCHER's, returns the others' indexes
_RENEW = """
local lost = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('PEXPIRE', key, ARGV[2])
  else
    table.insert(lost, i)
  end
end
return lost
"""


class Watch(BaseModel):
    """What a parked run waits for; its stage task is sent when it comes, or at `until` in any case."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: Stage
    until: float  # epoch seconds
    job: str | None = None  # a Ray job on the run's head: until it ends
    relay: bool = False  # ...relaying its progress lines meanwhile (train)
    nodes: dict[str, str] = {}  # instances as listed when parked (NodeInstance.look): until one changes


class Parking:
    """The parked runs in Redis: parked by their task, renewed and listed by the watcher."""

    def __init__(self, client: redis.Redis[str], ttl_ms: int) -> None:
        self.client, self.ttl_ms = client, ttl_ms
        self._park = client.register_script(_PARK)
        self._renew = client.register_script(_RENEW)

    def park(self, run_id: str, owner: str, watch: Watch) -> bool:
        """Hand the run from task `owner` to the watcher; False (nothing changed) if no watcher holds the
        lease or `owner` lost the run."""
        args = [owner, WATCHER, self.ttl_ms, run_id, watch.model_dump_json()]
        return bool(self._park(keys=[tick_key(run_id), PARKED, WATCHER_LEASE], args=args))

    def parked(self) -> dict[str, Watch]:
        return {run_id: Watch.model_validate_json(raw) for run_id, raw in self.client.hgetall(PARKED).items()}

    def renew(self, run_ids: list[str]) -> list[str]:
        """Renew the parked runs' claims; the ids of those the watcher no longer holds (dropped here)."""
        if not run_ids:
            return []
        lost_at = self._renew(keys=[tick_key(r) for r in run_ids], args=[WATCHER, self.ttl_ms])
        lost = [run_ids[int(i) - 1] for i in lost_at]
        self.drop(lost)
        return lost

    def drop(self, run_ids: list[str]) -> None:
        if run_ids:
            self.client.hdel(PARKED, *run_ids)
