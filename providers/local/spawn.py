"""Processes of local Ray nodes: started detached from the fleet (double fork, a session of their own),
waited for until gone, and the small owner-only files they are given (their Ray token)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import psutil


def wait_gone(procs: list[psutil.Process], timeout_s: float) -> bool:
    """Wait until every process has ended (a zombie has: it only waits for its parent to read its exit
    status, which a killed head's reparented processes may not get soon); whether they all did in time.
    Not psutil.wait_procs: it waits on a zombie that is not our child until its timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = 0
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                alive += proc.status() != psutil.STATUS_ZOMBIE
        if not alive:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def spawn_detached(argv: list[str], env: dict[str, str], log_path: Path) -> int:
    """Start argv in a new session, detached from us (double fork), output to log_path; return its pid."""
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked child
        try:
            os.close(read_fd)
            os.setsid()
            grandchild = os.fork()
            if grandchild == 0:
                out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(out, 1)
                os.dup2(out, 2)
                os.closerange(3, 65536)
                try:
                    os.execve(argv[0], argv, env)
                finally:
                    os._exit(127)
            os.write(write_fd, str(grandchild).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    os.waitpid(child, 0)
    return int(data.decode() or 0)


def write_private(path: Path, text: str, uid: int | None = None) -> Path:
    """Write `text` to `path`, readable by its owner only (`uid` when given, else this process's user)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        if uid is not None:
            os.fchown(handle.fileno(), uid, uid)
        handle.write(text)
    return path
