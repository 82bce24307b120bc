"""bench/scale.py's processes: the fake clouds (bench/scale_fake.py), the fleet's Celery workers and beat,
the notifier; started as a user starts them (real `fleet` commands) and stopped again, whole groups."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

REPO = Path(__file__).resolve().parents[1]
STAGE_QUEUES = ("provision", "prepare", "train", "finalize")
LAYOUTS = ("compose", "up")


@dataclass
class Proc:
    """One process this bench started (in a session of its own), its log, and what it is."""

    name: str
    popen: subprocess.Popen[str]
    log: IO[str] | None = None
    fleet: bool = True  # a process of the fleet (its RSS counts), not a fake
    url: str | None = field(default=None)

    def tree(self) -> list[psutil.Process]:
        """The process and its children (a worker's pool), as they are now."""
        try:
            top = psutil.Process(self.popen.pid)
            return [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []


def serve_fake(vendor: str, home: Path, api_key: str, train_s: float, boot_s: float, offers: int) -> Proc:
    """bench/scale_fake.py VENDOR in its own process; returns once it printed its URL."""
    argv = [sys.executable, str(REPO / "bench" / "scale_fake.py"), vendor, "--home", str(home)]
    argv += ["--api-key", api_key, "--train-seconds", str(train_s), "--boot-seconds", str(boot_s)]
    argv += ["--offers", str(offers)]
    home.mkdir(parents=True, exist_ok=True)
    log = (home / "fake.log").open("w")
    popen = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True
    )
    assert popen.stdout is not None
    url = popen.stdout.readline().strip()
    if not url.startswith("http://"):
        raise SystemExit(f"the fake {vendor} did not start; see {home / 'fake.log'}")
    return Proc(f"fake-{vendor}", popen, log, fleet=False, url=url)


def fleet_proc(name: str, args: list[str], env: dict[str, str], logs: Path) -> Proc:
    """`python -m fleet ARGS` in a session of its own, its output in `logs/NAME.log`."""
    logs.mkdir(parents=True, exist_ok=True)
    log = (logs / f"{name}.log").open("w")
    popen = subprocess.Popen(
        [sys.executable, "-m", "fleet", *args],
        env=env,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    return Proc(name, popen, log)


def start_workers(env: dict[str, str], layout: str, concurrency: int, logs: Path) -> list[Proc]:
    """The fleet's Celery side. `compose`: as docker-compose.yml runs it, a `fleet worker -Q STAGE -c N`
    per stage queue, `-Q reap -c 1` and `fleet beat`. `up`: one `fleet up` (every queue, its beat inside),
    with FLEET_WORKER_CONCURRENCY=N."""
    if layout == "up":
        return [fleet_proc("up", ["up"], {**env, "FLEET_WORKER_CONCURRENCY": str(concurrency)}, logs)]
    procs = [
        fleet_proc(f"worker-{q}", ["worker", "-Q", q, "-c", str(concurrency)], env, logs)
        for q in STAGE_QUEUES
    ]
    procs.append(fleet_proc("worker-reap", ["worker", "-Q", "reap", "-c", "1"], env, logs))
    procs.append(fleet_proc("beat", ["beat"], env, logs))
    return procs


def stop(procs: list[Proc], timeout_s: float = 30.0) -> None:
    """SIGTERM to each process's group, then SIGKILL to what is left of it after `timeout_s`."""
    for proc in procs:
        if proc.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.popen.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, signal.SIGKILL)
            proc.popen.wait(10)
        with contextlib.suppress(ProcessLookupError):  # a pool child that outlived its parent
            os.killpg(proc.popen.pid, signal.SIGKILL)
        if proc.log is not None:
            proc.log.close()


def rss(procs: list[Proc]) -> tuple[int, int, int]:
    """(total RSS of the fleet's processes, the largest one's, how many), in bytes."""
    sizes = []
    for proc in procs:
        if not proc.fleet:
            continue
        for member in proc.tree():
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                sizes.append(member.memory_info().rss)
    return sum(sizes), max(sizes, default=0), len(sizes)


def _cpu(members: list[psutil.Process]) -> float:
    total = 0.0
    for member in members:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            times = member.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


def cpu_seconds(procs: list[Proc], redis_socket: str) -> dict[str, float]:
    """CPU seconds (user + system) used so far by each kind of process: the fleet's workers, its notifier,
    the fake clouds (and their nodes), the Redis server, and this bench (the fake Discord runs in it)."""
    kinds: dict[str, list[psutil.Process]] = {"workers": [], "notifier": [], "fakes": []}
    for proc in procs:
        kind = (
            "fakes" if proc.name.startswith("fake-") else "notifier" if proc.name == "notify" else "workers"
        )
        kinds[kind] += proc.tree()
    kinds["redis"] = [
        p
        for p in psutil.process_iter(["name", "cmdline"])
        if p.info["name"] == "redis-server" and redis_socket in " ".join(p.info["cmdline"] or [])
    ] if redis_socket else []  # fmt: skip
    kinds["bench"] = [psutil.Process()]
    return {kind: round(_cpu(members), 1) for kind, members in kinds.items()}
