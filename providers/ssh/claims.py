"""Which run holds which pool machine: claims in Redis, taken all at once and given back by instance.

A pool machine is held whole by one node of a run's attempt (its instance name, `tf-<run>-<attempt>`, or
`...-<k>` for a cluster's node k, as a rented node's): two runs never share its GPUs, and what a run does
to the machine (its Ray node, its files) is that run's alone. A cluster's machines are claimed in one step
or not at all (a Lua script), so two runs asking for two machines each cannot each end up holding one and
waiting for ever. The claim then records the node started there (its ports, temp dir, session), so that any
process of the fleet can reach it, stop it, and give the machine back.

A claim has no expiry: a run may train for days, and a claim that lapsed under a live run would let a
second run onto its GPUs. It ends when the run's finalize gives it back, or when the reaper finds it held
by an instance whose run is over or unknown (a worker that died mid-provision), as it ends a rented
instance's billing; the claim records when it began, for `fleet pools` and for the hours a price bills.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import redis
from pydantic import BaseModel, ConfigDict

from providers.ssh.node import PoolNode
from providers.ssh.pools import Machine

KEY = "fleet:pool:{pool}"
"""A hash per pool: machine name -> its claim (JSON)."""

_CLAIM_ALL = """
for i = 1, #ARGV, 3 do
  local held = redis.call('HGET', KEYS[1], ARGV[i])
  if held and cjson.decode(held)['instance'] ~= ARGV[i + 1] then return 0 end
end
for i = 1, #ARGV, 3 do redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 2]) end
return 1
"""

_NOTE = """
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held or cjson.decode(held)['instance'] ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
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
    """One machine held: by which node of which run (its instance name), since when (epoch seconds), and
    the node started there once it is (None: not yet)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance: str
    run_id: str
    since: float
    node: PoolNode | None = None

    def held_s(self, now: float | None = None) -> float:
        """How long it has been held."""
        return max(0.0, (time.time() if now is None else now) - self.since)


class Claims:
    """The claims of every pool, in the fleet's Redis."""

    def __init__(self, client: redis.Redis[str]) -> None:
        self.client = client

    def claim(self, machines: Sequence[Machine], instances: Sequence[str], run_id: str) -> bool:
        """Hold each of `machines` (one pool's) for the instance at its place in `instances` (a cluster's
        nodes, each on its own machine), or none of them; whether it did. A machine that its instance holds
        already is held still (a retried provision)."""
        if not machines or len(machines) != len(instances):
            raise ValueError("one instance for each machine to claim")
        pools = {m.pool for m in machines}
        if len(pools) != 1:
            raise ValueError(f"one pool's machines at a time, not {sorted(pools)}")
        (pool,) = pools
        now = time.time()
        args: list[str] = []
        for machine, instance in zip(machines, instances, strict=True):
            claim = Claim(instance=instance, run_id=run_id, since=now)
            args += [machine.name, instance, claim.model_dump_json()]
        script = self.client.register_script(_CLAIM_ALL)
        return bool(script(keys=[KEY.format(pool=pool)], args=args))

    def started(self, pool: str, machine: str, node: PoolNode) -> bool:
        """Record the node started on `machine` in its claim, if its instance holds the machine still."""
        held = self.held(pool).get(machine)
        if held is None or held.instance != node.instance:
            return False
        noted = held.model_copy(update={"node": node}).model_dump_json()
        script = self.client.register_script(_NOTE)
        return bool(script(keys=[KEY.format(pool=pool)], args=[machine, node.instance, noted]))

    def find(self, pools: Iterable[str], instance: str) -> tuple[str, str, Claim] | None:
        """The pool and machine `instance` holds, and its claim; None when it holds none."""
        for pool in pools:
            for machine, claim in self.held(pool).items():
                if claim.instance == instance:
                    return pool, machine, claim
        return None

    def release(self, pool: str, instance: str) -> list[str]:
        """Give back the machines of `pool` that `instance` holds; their names (none: it held none)."""
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
