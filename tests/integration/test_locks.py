"""Locks held under a token (broker.locks.Lease), against a real Redis: a renewed lease outlives its TTL,
one that is not renewed expires, and only its holder's release deletes it."""

from __future__ import annotations

import time

import pytest
import redis

from broker.locks import Lease

pytestmark = pytest.mark.integration
KEY = "tf:test:lock"


def test_a_renewed_lease_outlives_its_ttl_and_only_its_holder_lets_it_go(
    redis_client: redis.Redis[str],
) -> None:
    # A TTL of seconds, as the fleet's are: a renewer thread kept off the CPU a few hundred ms (a loaded
    # machine) must not lose the lock, as it did with a TTL of 0.6 s.
    held = Lease(redis_client, KEY, 3.0, renew=True, holder="host:1")
    assert held.acquire() and held.token.startswith("host:1:")
    time.sleep(7.5)  # two and a half TTLs
    other = Lease(redis_client, KEY, 0.6)
    assert not other.acquire(wait_s=0.3)  # still held: renewed
    held.release()
    assert redis_client.get(KEY) is None
    assert other.acquire()

    time.sleep(0.9)  # `other` does not renew: its lock is gone after one TTL
    third = Lease(redis_client, KEY, 5)
    assert third.acquire()
    other.release()  # late: it must not delete the new holder's lock
    assert redis_client.get(KEY) == third.token
    third.release()
