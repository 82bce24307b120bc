"""providers.ssh.node against a real sshd (tests/sshd.py): a rented node's start script run on a pool
machine as the pool's user, the node's software set up by the node setup program into that user's own
venv (the machine's python3 has none of it), a Ray head on the machine's loopback at ports of its own,
its Jobs API reached through the SSH tunnel with the node's token only, and nothing left after stop."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from providers import bootstrap
from providers.ssh.connect import Connection
from providers.ssh.node import PoolNode, log_tail, running, start_node, stop
from providers.ssh.tunnel import Tunnel
from tests.sshd import Sshd, start_sshd

pytestmark = pytest.mark.integration
READY_S = 300  # the first node of a test session installs the node's software into the user's venv


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    server = start_sshd(tmp_path / "sshd")
    yield server
    server.stop()


def _answers(tunnel: Tunnel, token: str) -> int | None:
    try:
        return httpx.get(
            f"{tunnel.url}/api/version", headers={"Authorization": f"Bearer {token}"}, timeout=5
        ).status_code
    except httpx.HTTPError:
        return None


def _wait_ready(ssh: Connection, node: PoolNode, tunnel: Tunnel, token: str) -> None:
    deadline = time.monotonic() + READY_S
    while _answers(tunnel, token) != 200:
        assert running(ssh, node), f"the node ended: {log_tail(ssh, node)}"
        assert time.monotonic() < deadline, f"no Jobs API after {READY_S} s: {log_tail(ssh, node)}"
        time.sleep(1)


def test_a_head_starts_over_ssh_answers_through_the_tunnel_and_leaves_nothing(sshd: Sshd) -> None:
    token = secrets.token_hex(16)
    env = {**bootstrap.node_setup_env(), bootstrap.TOKEN_ENV: token}
    with Connection(sshd.machine(), sshd.known_hosts) as ssh:
        node = start_node(ssh, "tf-sshnode-1", env)
        try:
            assert node.home.endswith("/.trainfleet/nodes/tf-sshnode-1")
            owner = ssh.run(f"ps -o user= -p {node.session}").stdout.strip()
            assert owner == sshd.user
            with Tunnel(ssh, node.dashboard_port) as tunnel:
                _wait_ready(ssh, node, tunnel, token)
                assert _answers(tunnel, "not-the-token") in (401, 403)
            command_lines = ssh.run("ps -eo args").stdout
            assert token not in command_lines  # the token came in a file, never on a command line
            assert ssh.run(f"test -e {node.home}/env").status == 1  # ... which the node deleted
            setup = ssh.run(f"cat {node.home}/root/node-setup.json").stdout
            assert '"python": "' in setup and "/.trainfleet/venv/bin/python" in setup
        finally:
            stop(ssh, node)
        assert not running(ssh, node)
        assert ssh.run(f"test -e {node.home} || test -e {node.temp_dir}").status == 1


def _alive_nodes(tunnel: Tunnel, token: str) -> int:
    try:
        reply = httpx.get(
            f"{tunnel.url}/api/v0/nodes", headers={"Authorization": f"Bearer {token}"}, timeout=10
        )
        rows = reply.json()["data"]["result"]["result"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return 0
    return sum(1 for row in rows if row.get("state") == "ALIVE")


def test_two_machines_make_one_cluster_and_both_are_left_clean(tmp_path: Path) -> None:
    token = secrets.token_hex(16)
    env = {**bootstrap.node_setup_env(), bootstrap.TOKEN_ENV: token}
    one, two = start_sshd(tmp_path / "one"), start_sshd(tmp_path / "two")
    try:
        with Connection(one.machine(), one.known_hosts) as a, Connection(two.machine(), two.known_hosts) as b:
            head = start_node(a, "tf-sshpair-1", env, node_ip="127.0.0.1")
            worker = None
            try:
                worker = start_node(
                    b, "tf-sshpair-1-n1", env, join=f"127.0.0.1:{head.gcs_port}", node_ip="127.0.0.1"
                )
                assert "port" not in worker.ports and "dashboard_port" not in worker.ports
                with Tunnel(a, head.dashboard_port) as tunnel:
                    _wait_ready(a, head, tunnel, token)
                    deadline = time.monotonic() + READY_S
                    while _alive_nodes(tunnel, token) < 2:
                        assert running(b, worker), f"the worker ended: {log_tail(b, worker)}"
                        assert time.monotonic() < deadline, f"the worker never joined: {log_tail(b, worker)}"
                        time.sleep(1)
            finally:
                if worker is not None:
                    stop(b, worker)
                stop(a, head)
            assert not running(a, head) and not running(b, worker)
    finally:
        one.stop()
        two.stop()
