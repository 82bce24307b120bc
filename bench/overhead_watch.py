"""What bench/overhead.py times, the same way on both sides: when the trainer printed its STARTED and
FINISHED lines, and when every process the command started is gone.

The trainer's rank-0 worker is a Ray actor: its stdout goes to a `worker-*.out` file in its Ray session's
logs, at once (the line is flushed). A thread tails those files (the trainer alone's Ray temp dir, or
every local node's `/tmp/tfray-*`) and stamps each progress line when it first shows; a line belongs to
the side whose FINISHED line, in the same file, names the side's directory (`output_dir`). The poll is
every 20 ms, so a stamp is at most that late, alike on both sides.

The bench process makes itself a child subreaper (Linux's PR_SET_CHILD_SUBREAPER): every process a command
starts stays below it, however it detaches (Ray's daemons, the worker `fleet run` starts, a sandboxed
node), so "gone" means no process left below the bench but the embedded Redis, which outlives runs by
design (`fleet down` stops it).
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from trainer.progress import parse

PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.02
KEPT = frozenset({"redis-server"})  # the embedded Redis: the fleet's, not the run's


def become_subreaper() -> None:
    """Orphans of this process's descendants become its children, not init's."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


@dataclass
class Lines:
    """Progress lines seen in the Ray worker logs under some roots: (kind, first seen, file, record)."""

    roots: list[str]  # globs of Ray temp dirs (a local node's appears only once it starts)
    since: float  # files last written before this are someone else's
    seen: list[tuple[str, float, Path, dict[str, object]]] = field(default_factory=list)
    _offsets: dict[Path, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="tail-ray-logs")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._scan()  # anything written since the last poll

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            self._scan()

    def _scan(self) -> None:
        for root in self.roots:
            for name in glob.glob(f"{root}/session_*/logs/worker-*.out"):
                self._read(Path(name))

    def _read(self, path: Path) -> None:
        try:
            stat = path.stat()
        except OSError:
            return
        at = self._offsets.get(path, 0)
        if stat.st_size <= at or stat.st_mtime < self.since:
            return
        now = time.perf_counter()
        with open(path, "rb") as f:
            f.seek(at)
            chunk = f.read()
        whole = chunk[: chunk.rfind(b"\n") + 1]
        self._offsets[path] = at + len(whole)
        for record in parse(whole.decode(errors="replace")):
            self.seen.append((str(record["kind"]), now, path, record))

    def stamp(self, kind: str, owner: str) -> float | None:
        """When `kind` was first printed by the worker whose FINISHED line names `owner`."""
        files = {p for k, _, p, rec in self.seen if k == "finished" and owner in str(rec.get("output_dir"))}
        times = [t for k, t, p, _ in self.seen if k == kind and p in files]
        return min(times) if times else None


def _below() -> list[psutil.Process]:
    """Every live process below this one but the kept ones; reaps the zombies among its children."""
    me = psutil.Process()
    for child in me.children():
        if child.status() == psutil.STATUS_ZOMBIE:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child.pid, os.WNOHANG)
    live = []
    for proc in me.children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.name() not in KEPT:
                live.append(proc)
        except psutil.NoSuchProcess:
            continue
    return live


@dataclass
class Timed:
    """One command's times, in seconds from its start."""

    exit_s: float
    gone_s: float
    lingering: list[str]  # what was still there at the deadline (then gone_s is the deadline)


def run_until_gone(argv: list[str], env: dict[str, str], cwd: Path, log: Path, t0: float) -> Timed:
    """Run `argv` to its end, then wait for every process it started to be gone (at most 120 s)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        code = proc.wait(timeout=900)
    exit_s = time.perf_counter() - t0
    if code != 0:
        raise SystemExit(f"{argv[1:4]} failed (exit {code}); see {log}")
    deadline = time.perf_counter() + 120
    while (left := _below()) and time.perf_counter() < deadline:
        time.sleep(POLL_S)
    lingering = [f"{p.pid}:{p.name()}" for p in left]
    return Timed(exit_s=exit_s, gone_s=time.perf_counter() - t0, lingering=lingering)
