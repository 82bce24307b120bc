"""Which run holds which pool machine: claims in Redis, taken all at once and given back by instance.

A pool machine is held whole by one run's attempt (its instance name, `tf-<run>-<attempt>`, as a rented
node's): two runs never share its GPUs, and what a run does to the machine (its Ray head, its files) is
that run's alone. A cluster's machines are claimed in one step or not at all (a Lua script), so two
runs asking for two machines each cannot each end up holding one and waiting for ever.

A claim has no expiry: a run may train for days, and a claim that lapsed under a live run would let a
second run onto its GPUs. It ends when the run's finalize gives it back, or when the reaper finds it held
by an instance whose run is over or unknown (a worker that died mid-provision), as it ends a rented
instance's billing; the claim records when it began, for `fleet pools` and for the hours a price bills.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import redis
from pydantic import BaseModel, ConfigDict

from providers.ssh.pools import Machine

KEY = "fleet:pool:{pool}"
"""A hash per pool: machine name -> its claim (JSON)."""

_CLAIM_ALL = """
for i = 3, #ARGV do
  local held = redis.call('HGET', KEYS[1], ARGV[i])
  if held and cjson.decode(held)['instance'] ~= ARGV[2] then return 0 end
end
for i = 3, #ARGV do redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[1]) end
return 1
"""

_RELEASE = """
local released = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if cjson.decode(all[i + 1])['instance'] == ARGV[1] then
    redis.call('HDEL', KEYS[1], all[i])
    table.insert(released, all[i])
  end
end
return released
"""


class Claim(BaseModel):
    """One machine held: by which attempt of which run, since when (epoch seconds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance: str
    run_id: str
    since: float

    def held_s(self, now: float | None = None) -> float:
        """How long it has been held."""
        return max(0.0, (time.time() if now is None else now) - self.since)


class Claims:
    """The claims of every pool, in the fleet's Redis."""

    def __init__(self, client: redis.Redis[str]) -> None:
        self.client = client

    def claim(self, machines: Sequence[Machine], instance: str, run_id: str) -> bool:
        """Hold every one of `machines` (one pool's) for `instance`, or none of them; whether it did. An
        instance that holds them already holds them still (a retried provision)."""
        if not machines:
            raise ValueError("no machines to claim")
        pools = {m.pool for m in machines}
        if len(pools) != 1:
            raise ValueError(f"one pool's machines at a time, not {sorted(pools)}")
        (pool,) = pools
        claim = Claim(instance=instance, run_id=run_id, since=time.time())
        script = self.client.register_script(_CLAIM_ALL)
        names = [m.name for m in machines]
        return bool(script(keys=[KEY.format(pool=pool)], args=[claim.model_dump_json(), instance, *names]))

    def release(self, pool: str, instance: str) -> list[str]:
        """Give back every machine of `pool` that `instance` holds; their names (none: it held none)."""
        script = self.client.register_script(_RELEASE)
        return sorted(str(n) for n in script(keys=[KEY.format(pool=pool)], args=[instance]))

    def held(self, pool: str) -> dict[str, Claim]:
        """The pool's held machines, by name."""
        raw = self.client.hgetall(KEY.format(pool=pool))
        return {name: Claim.model_validate_json(value) for name, value in raw.items()}

    def of(self, pool: str, instance: str) -> list[str]:
        """The machines of `pool` that `instance` holds, by name."""
        return sorted(n for n, c in self.held(pool).items() if c.instance == instance)

    def free(self, machines: Sequence[Machine]) -> list[Machine]:
        """Those of `machines` no one holds."""
        held: dict[str, set[str]] = {}
        for pool in {m.pool for m in machines}:
            held[pool] = set(self.held(pool))
        return [m for m in machines if m.name not in held[m.pool]]
