"""Issue 19, finding 8: `fleet flower` served its whole API (send-task, revoke, shutdown) on 127.0.0.1 with no
password and no Host/Origin check, so a web page in the user's browser could drive it (a cross-site form
post, or DNS rebinding: a name of the attacker's that resolves to 127.0.0.1).

Against a real `fleet flower` process (tests/integration/flowerproc.py) on the session's Redis: every API
call needs the password it generated (401 without it), a request under a foreign Host is refused, a
cross-origin POST is refused, the password lives in an owner-only file, is printed on the first start only,
and never appears on the process's command line or in its environment.
"""

from __future__ import annotations

import base64
import http.client
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.fleetproc import fleet_env
from tests.integration.flowerproc import FlowerAt, flower

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[tuple[FlowerAt, Path]]:
    """One `fleet flower` for the module (its first start: it generates the password), and its home."""
    home = tmp_path_factory.mktemp("flower") / "home"
    env = fleet_env(home, REDIS_URL=redis_url, FLOWER_ENABLE_EVENTS="false")
    with flower(env, home / "flower.log") as at:
        yield at, home


def call(at: FlowerAt, method: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """One request to Flower, with exactly `headers` (Host defaults to the address it was reached at)."""
    port = int(at.url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        given = {"Host": f"127.0.0.1:{port}", **(headers or {})}
        conn.request(method, path, body=b"" if method == "POST" else None, headers=given)
        reply = conn.getresponse()
        return reply.status, reply.read().decode(errors="replace")
    finally:
        conn.close()


def basic(credential: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(credential.encode()).decode()}


def test_the_api_refuses_a_caller_without_the_password(started: tuple[FlowerAt, Path]) -> None:
    at, _home = started
    user = at.credential.partition(":")[0]
    for method, path in (
        ("GET", "/api/tasks"),
        ("GET", "/api/workers"),
        ("POST", "/api/task/revoke/some-task"),
        ("POST", "/api/task/send-task/trainfleet.reap"),
        ("POST", "/api/worker/shutdown/some-worker"),
        ("GET", "/metrics"),
        ("GET", "/"),
    ):
        for headers in ({}, basic(f"{user}:wrong-password"), {"Authorization": "Bearer x"}):
            status, _body = call(at, method, path, headers)
            assert status == 401, (method, path, headers)
    status, body = call(at, "GET", "/api/tasks", basic(at.credential))
    assert status == 200 and body.startswith("{")
    assert call(at, "GET", "/healthcheck") == (200, "OK")  # says nothing else


def test_a_foreign_host_is_refused_even_with_the_password(started: tuple[FlowerAt, Path]) -> None:
    at, _home = started
    port = int(at.url.rsplit(":", 1)[1])
    for host in (f"attacker.example:{port}", "127.0.0.1:1", f"127.0.0.1.nip.io:{port}", ""):
        status, body = call(at, "GET", "/api/tasks", {**basic(at.credential), "Host": host})
        assert status == 403 and "Host" in body, host
    for host in (f"localhost:{port}", f"LOCALHOST:{port}"):
        assert call(at, "GET", "/api/tasks", {**basic(at.credential), "Host": host})[0] == 200


def test_a_cross_origin_post_is_refused_even_with_the_password(started: tuple[FlowerAt, Path]) -> None:
    at, _home = started
    port = int(at.url.rsplit(":", 1)[1])
    path = "/api/task/revoke/no-such-task"
    for foreign in (
        {"Origin": "http://attacker.example"},
        {"Origin": "null"},
        {"Origin": f"http://127.0.0.1:{port + 1}"},
        {"Referer": "http://attacker.example/page.html"},
        {"Origin": f"http://localhost:{port}", "Referer": "http://attacker.example/"},
    ):
        status, body = call(at, "POST", path, {**basic(at.credential), **foreign})
        assert status == 403 and "cross-origin" in body, foreign
    # Its own pages (same origin), and a client that sends neither header (curl, scripts), may.
    for own in ({"Origin": f"http://127.0.0.1:{port}"}, {"Referer": f"http://localhost:{port}/tasks"}, {}):
        status, body = call(at, "POST", path, {**basic(at.credential), **own})
        assert status == 200 and "Revoked" in body, own


def test_the_password_is_kept_owner_only_and_shown_once(
    started: tuple[FlowerAt, Path], redis_url: str
) -> None:
    at, home = started
    kept = home / "flower" / "basic-auth"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
    user, _, password = at.credential.partition(":")
    assert kept.read_text().strip() == at.credential and user == "fleet" and len(password) >= 32
    log = home / "flower.log"
    assert log.read_text().count(password) == 1  # printed when it was made
    # A restart (the module's Flower is still up: another port) uses the kept one and does not print it.
    env = fleet_env(home, REDIS_URL=redis_url, FLOWER_ENABLE_EVENTS="false")
    again_log = home / "flower-again.log"
    with flower(env, again_log) as again:
        assert again.credential == at.credential
        assert call(again, "GET", "/api/tasks", basic(at.credential))[0] == 200
    text = again_log.read_text()
    assert password not in text and str(kept) in text


def test_the_password_is_not_on_the_command_line_nor_in_the_environment(
    started: tuple[FlowerAt, Path],
) -> None:
    at, _home = started
    password = at.credential.partition(":")[2]
    proc = Path("/proc") / str(at.proc.pid)
    cmdline = (proc / "cmdline").read_bytes().decode()
    assert "flower" in cmdline and password not in cmdline  # what `ps` shows every user
    assert password not in (proc / "environ").read_bytes().decode(errors="replace")
