"""providers.ssh.claims on a real Redis: a machine held by one attempt at a time, a cluster's machines
all at once or none (each node its own), a retried claim by the same attempt, the node a claim records,
and release by instance."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import redis

from providers.ssh.claims import Claims
from providers.ssh.node import PoolNode
from providers.ssh.pools import Machine

pytestmark = pytest.mark.integration


def machine(host: str, pool: str = "lab") -> Machine:
    return Machine(
        pool=pool, host=host, port=22, user="fleet", key=Path("/k"), gpus=8, gpu="H100", labels=(),
        hourly_usd=2.0, host_key=None,
    )  # fmt: skip


A, B, C = machine("a"), machine("b"), machine("c")


def test_a_machine_is_held_by_one_attempt_until_it_gives_it_back(redis_client: redis.Redis[str]) -> None:
    claims = Claims(redis_client)
    assert claims.claim([A], ["tf-run1-1"], "run1")
    assert not claims.claim([A], ["tf-run2-1"], "run2")
    assert claims.claim([A], ["tf-run1-1"], "run1")  # the same attempt, retried: still its own
    assert claims.held("lab")["a"].instance == "tf-run1-1"
    assert claims.free([A, B]) == [B]
    assert claims.release("lab", "tf-run2-1") == []
    assert claims.release("lab", "tf-run1-1") == ["a"]
    assert claims.claim([A], ["tf-run2-1"], "run2")


def test_a_cluster_is_claimed_whole_or_not_at_all(redis_client: redis.Redis[str]) -> None:
    claims = Claims(redis_client)
    assert claims.claim([B], ["tf-other-1"], "other")
    assert not claims.claim([A, B], ["tf-run1-1-0", "tf-run1-1-1"], "run1")
    assert claims.of("lab", "tf-run1-1-0") == []  # it took nothing, not even the free one
    assert claims.claim([A, C], ["tf-run1-1-0", "tf-run1-1-1"], "run1")
    assert (claims.of("lab", "tf-run1-1-0"), claims.of("lab", "tf-run1-1-1")) == (["a"], ["c"])
    assert claims.release("lab", "tf-run1-1-1") == ["c"]  # each node gives back its own machine
    assert claims.free([A, C]) == [C]


def test_a_claim_records_its_node_only_while_its_instance_holds_it(redis_client: redis.Redis[str]) -> None:
    claims = Claims(redis_client)
    claims.claim([A], ["tf-run1-1"], "run1")
    node = PoolNode(
        instance="tf-run1-1", machine="a", home="/home/fleet/.trainfleet/nodes/tf-run1-1",
        temp_dir="/tmp/tfpool-x", ports={"port": 7000}, worker_ports=(7100, 7200), session=42,
    )  # fmt: skip
    assert claims.started("lab", "a", node)
    found = claims.find(["other", "lab"], "tf-run1-1")
    assert found is not None and found[:2] == ("lab", "a") and found[2].node == node
    claims.release("lab", "tf-run1-1")
    claims.claim([A], ["tf-run2-1"], "run2")
    assert not claims.started("lab", "a", node)  # the machine is another run's now: nothing written
    assert claims.held("lab")["a"].node is None
    assert claims.find(["lab"], "tf-run1-1") is None


def test_a_retried_claim_keeps_when_it_began(redis_client: redis.Redis[str]) -> None:
    claims = Claims(redis_client)
    claims.claim([A], ["tf-run1-1"], "run1")
    first = claims.held("lab")["a"].since
    claims.claim([A], ["tf-run1-1"], "run1")
    assert claims.held("lab")["a"].since == first


def test_of_many_runs_racing_for_two_machines_each_gets_both_or_none(redis_client: redis.Redis[str]) -> None:
    won: list[str] = []
    start = threading.Barrier(8)

    def race(i: int) -> None:
        claims = Claims(redis_client)  # redis-py clients are thread-safe
        start.wait()
        if claims.claim([A, B] if i % 2 else [B, A], [f"tf-run{i}-1-0", f"tf-run{i}-1-1"], f"run{i}"):
            won.append(f"tf-run{i}-1")

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert {c.instance for c in Claims(redis_client).held("lab").values()} == {f"{won[0]}-0", f"{won[0]}-1"}


def test_one_pool_at_a_time(redis_client: redis.Redis[str]) -> None:
    with pytest.raises(ValueError, match="one pool's machines at a time"):
        Claims(redis_client).claim([A, machine("d", pool="other")], ["tf-run1-1-0", "tf-run1-1-1"], "run1")
