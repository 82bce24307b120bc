"""Starting Celery workers and beat in this process (`fleet worker`, `fleet beat`, `fleet up`), the
heartbeat keys that tell the CLI which queues are served, and spawning a worker for `fleet run`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis
from celery import signals

from broker.app import app, configure
from broker.queues import QUEUES
from core import redisurl
from core.settings import Settings
from state.keys import WORKERS_PREFIX, worker_key
from state.stages import Stage

HEARTBEAT_S = 5
HEARTBEAT_TTL_S = 20


def start_heartbeat(client: redis.Redis[str], hostname: str, queues: list[str]) -> threading.Event:
    """Keep `tf:worker:<hostname>` alive while this worker runs; returns the event that stops it."""
    stop = threading.Event()
    value = json.dumps({"queues": queues, "pid": os.getpid(), "host": socket.gethostname()})

    def beat() -> None:
        while not stop.is_set():
            with contextlib.suppress(redis.RedisError):
                client.set(worker_key(hostname), value, ex=HEARTBEAT_TTL_S)
            stop.wait(HEARTBEAT_S)
        with contextlib.suppress(redis.RedisError):
            client.delete(worker_key(hostname))

    threading.Thread(target=beat, name="fleet-heartbeat", daemon=True).start()
    return stop


def served_queues(client: redis.Redis[str], host: str | None = None) -> set[str]:
    """Queues that some live worker (on `host`, when given) consumes (by the heartbeat keys)."""
    served: set[str] = set()
    for key in client.scan_iter(match=f"{WORKERS_PREFIX}*"):
        raw = client.get(key)
        beat = json.loads(raw) if raw else {}
        if beat and (host is None or beat.get("host") == host):
            served.update(beat.get("queues", []))
    return served


# Beat keeps its schedule in memory: the reaper's one entry is an interval, so there is nothing worth a file,
# and two beats on one home (two `fleet up`) no longer fight over one shelve file (which killed both).
BEAT_SCHEDULER = "celery.beat:Scheduler"


def worker_hostname(pid: int) -> str:
    """The Celery hostname of the worker process `pid` on this machine, which names its heartbeat key."""
    return f"fleet-{pid}@{socket.gethostname()}"


def run_worker(settings: Settings, redis_url: str, queues: list[str], concurrency: int, beat: bool) -> None:
    """Run a Celery worker in this process until it is told to stop."""
    from workers import context
    from workers.watcher import start_watcher

    configure(settings, redis_url)
    context.init(settings, redis_url)
    hostname = worker_hostname(os.getpid())
    client = redisurl.connect(redis_url, decode_responses=True)
    stopper: dict[str, threading.Event] = {}

    @signals.worker_process_init.connect(weak=False)
    def _warm(**_: Any) -> None:
        # Importing Ray's job client takes seconds here; do it while the first node boots, not after.
        threading.Thread(target=_import_ray_client, name="fleet-warm", daemon=True).start()

    @signals.worker_ready.connect(weak=False)
    def _ready(**_: Any) -> None:
        stopper["hb"] = start_heartbeat(client, hostname, queues)
        # The fleet's one watcher of parked runs is whichever worker's took the lease (workers.watcher).
        stopper["watch"] = start_watcher(context.get(), hostname)

    @signals.worker_shutting_down.connect(weak=False)
    def _down(**_: Any) -> None:
        for stop in stopper.values():
            stop.set()

    argv = ["worker", "-Q", ",".join(queues), "-c", str(concurrency), "-n", hostname, "--loglevel", "INFO"]
    # No mingle (a second's wait at start to sync revoked task ids: the fleet revokes none) and no gossip
    # (workers watching each other: the fleet's own heartbeat keys say who serves what: start_heartbeat).
    argv += ["--without-mingle", "--without-gossip"]
    if beat:
        argv += ["-B", "--scheduler", BEAT_SCHEDULER]  # (the worker's -S is its state db, not this)
    app.worker_main(argv)


def _import_ray_client() -> None:
    import ray.job_submission  # noqa: F401


def run_beat(settings: Settings, redis_url: str) -> None:
    """Run celery beat (the reaper's clock) in this process."""
    configure(settings, redis_url)
    app.start(["beat", "--loglevel", "INFO", "--scheduler", BEAT_SCHEDULER])


class SpawnedWorker:
    """A `fleet worker` child process that serves every queue (and runs beat) for `fleet run`."""

    def __init__(self, client: redis.Redis[str], redis_url: str, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.client = client
        self.log_path = log_dir / f"worker-{os.getpid()}.log"
        env = dict(os.environ, REDIS_URL=redis_url)
        argv = [sys.executable, "-m", "fleet", "worker", "--queues", ",".join(QUEUES), "--beat"]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.key = worker_key(worker_hostname(self.proc.pid))  # there while it takes tasks

    def stop(self, timeout_s: float = 20.0) -> None:
        """Celery's warm shutdown: SIGTERM to the worker alone, which lets its pool finish the tasks in hand
        (a pool child resets SIGTERM to its default, so a SIGTERM to the whole group would kill one mid-task:
        a reap pass between its ledger write and its event). Returns once the worker takes no more tasks
        (its heartbeat key is gone, which a `fleet run` after this one reads to start a worker of its own),
        not after Celery's pool has wound down (3 s of its threads' sleeps): the worker ends on its own.
        Either way its whole group is killed if it is still there `timeout_s` after the SIGTERM: at once if it
        still serves, else by a detached watchdog (a worker whose wind-down hangs must not stay alone)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while self.proc.poll() is None and self._serves() and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.proc.poll() is None and self._serves():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
            elif self.proc.poll() is None:
                kill_group_later(self.proc.pid, deadline - time.monotonic())
        self._log.close()

    def _serves(self) -> bool:
        try:
            return bool(self.client.exists(self.key))
        except redis.RedisError:
            return False  # the fleet's Redis is gone: the worker takes nothing more


def kill_group_later(pid: int, after_s: float) -> None:
    """Kill process group `pid` (its leader's pid) unless that process has ended within `after_s`: a detached
    `sh` that looks every 0.2 s, so the caller need not wait (or live) for it."""
    looks = max(1, round(after_s / 0.2))
    script = (
        f"i=0; while kill -0 {pid} 2>/dev/null && [ $i -lt {looks} ]; do sleep 0.2; i=$((i+1)); done; "
        f"kill -0 {pid} 2>/dev/null && kill -s KILL -- -{pid} 2>/dev/null; exit 0"
    )
    subprocess.Popen(
        ["/bin/sh", "-c", script],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def missing_queues(client: redis.Redis[str]) -> list[str]:
    served = served_queues(client)
    return [s.value for s in Stage if s.value not in served]


def wait_for_queues(client: redis.Redis[str], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while missing_queues(client):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True
