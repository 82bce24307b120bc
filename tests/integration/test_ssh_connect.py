"""providers.ssh.connect and .tunnel against a real sshd on this machine (tests/sshd.py): commands run as
the pool's user, host keys checked (unknown, changed, pinned, hashed), a machine that is down, a key the
machine refuses, and the Jobs API's port forwarded over the connection."""

from __future__ import annotations

import http.server
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.errors import AuthFailed
from providers.ssh.connect import Connection, HostKeyRefused, MachineDown
from providers.ssh.tunnel import Tunnel
from tests.sshd import Sshd, free_port, keypair, start_sshd

pytestmark = pytest.mark.integration


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    server = start_sshd(tmp_path / "sshd")
    yield server
    server.stop()


def test_a_command_runs_as_the_pools_user_with_its_status_and_input(sshd: Sshd) -> None:
    with Connection(sshd.machine(), sshd.known_hosts) as ssh:
        who = ssh.run("id -un")
        assert (who.status, who.stdout.strip()) == (0, sshd.user)
        failed = ssh.run("echo out; echo err >&2; exit 3")
        assert (failed.status, failed.stdout, failed.stderr) == (3, "out\n", "err\n")
        assert ssh.run("cat", stdin=b"through stdin").stdout == "through stdin"


def test_an_unknown_host_is_refused_with_how_to_check_its_key(sshd: Sshd, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts_empty"
    empty.write_text("")
    with pytest.raises(HostKeyRefused, match=rf"not in {empty}.*ssh-keyscan -p {sshd.port} 127.0.0.1"):
        Connection(sshd.machine(), empty)
    assert f"Accepted publickey for {sshd.user}" not in sshd.log


def test_a_changed_host_key_is_refused_naming_both_fingerprints(sshd: Sshd, tmp_path: Path) -> None:
    other = keypair(tmp_path / "other_host_key")
    sshd.known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {other}\n")
    with pytest.raises(
        HostKeyRefused,
        match=r"host key changed: the fleet knows ssh-ed25519 SHA256:\S+, "
        r"the machine showed ssh-ed25519 SHA256:\S+",
    ):
        Connection(sshd.machine(), sshd.known_hosts)
    assert f"Accepted publickey for {sshd.user}" not in sshd.log


def test_a_pinned_host_key_needs_no_known_hosts_and_a_wrong_pin_is_refused(
    sshd: Sshd, tmp_path: Path
) -> None:
    nowhere = tmp_path / "absent"
    with Connection(sshd.machine(host_key=sshd.host_key), nowhere) as ssh:
        assert ssh.run("true").status == 0
    wrong = keypair(tmp_path / "wrong")
    with pytest.raises(HostKeyRefused, match=r"changed.*update the pools file"):
        Connection(sshd.machine(host_key=wrong), sshd.known_hosts)


def test_hashed_known_hosts_entries_are_read(sshd: Sshd) -> None:
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(sshd.known_hosts)], check=True, capture_output=True)
    assert "127.0.0.1" not in sshd.known_hosts.read_text()
    with Connection(sshd.machine(), sshd.known_hosts) as ssh:
        assert ssh.run("true").status == 0


def test_a_machine_that_is_down_is_named_with_why(sshd: Sshd) -> None:
    down = sshd.machine(port=free_port())
    with pytest.raises(
        MachineDown, match=rf"127.0.0.1:{down.port}: no SSH connection \(connection refused\)"
    ):
        Connection(down, sshd.known_hosts)


def test_a_key_the_machine_does_not_know_is_refused(sshd: Sshd, tmp_path: Path) -> None:
    keypair(tmp_path / "stranger")
    with pytest.raises(AuthFailed, match=f"{sshd.user} was refused with {tmp_path / 'stranger'}"):
        Connection(sshd.machine(key=tmp_path / "stranger"), sshd.known_hosts)


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello from {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def web() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def test_a_tunnel_carries_http_to_the_machines_loopback(sshd: Sshd, web: int) -> None:
    with Connection(sshd.machine(), sshd.known_hosts) as ssh, Tunnel(ssh, web) as tunnel:
        assert tunnel.local_port != web
        for path in ("/one", "/two"):  # a connection each
            assert httpx.get(tunnel.url + path, timeout=10).text == f"hello from {path}"


def test_a_tunnel_goes_through_sshd_which_may_refuse_it(tmp_path: Path, web: int) -> None:
    server = start_sshd(tmp_path / "sshd", extra=["AllowTcpForwarding no"])
    try:
        with Connection(server.machine(), server.known_hosts) as ssh, Tunnel(ssh, web) as tunnel:
            with pytest.raises(httpx.HTTPError):
                httpx.get(tunnel.url + "/refused", timeout=10)
            assert ssh.run("true").status == 0  # the connection itself is fine
    finally:
        server.stop()
