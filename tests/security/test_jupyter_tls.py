"""Issue 39, item 5: a vast.ai node's JupyterLab is reached over TLS, with the certificate the fleet made for
that node.

`fleet jupyter RUN` gives an https URL for a vast.ai run, and the port it names speaks TLS, with the pinned
certificate, and nothing else (the fake's node publishes it as its start script does: through the node's
TLS front); the fingerprint it prints is that certificate's. The node's own TLS front
(providers.onnode.tlsfront, run as the start script runs it) passes both its ports through: the Jobs API's and
JupyterLab's."""

from __future__ import annotations

import hashlib
import http.server
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from fleet.cli import cli
from providers.base import JUPYTER_PORT, LaunchRequest
from providers.bootstrap import ACCESS_ENV, INNER_JUPYTER_PORT, tlsfront_argv
from providers.node import fingerprint
from providers.onnode import tlsfront
from providers.registry import FleetSettings
from providers.tokens import self_signed
from providers.vastai.section import VastAISection
from state.models import Instance, InstanceState
from tests.factories import ledger_run
from tests.fakes.nodes import unused_port
from tests.fakes.vastai import FakeVastAI
from workers import context

KEY = "jupyter-tls-key"
SECTION = VastAISection(gpu="RTX_A5000", cloud_type="ALL", max_bid_per_gpu=0.5, one_shot=False, jupyter=True)


@pytest.fixture
def fake(fleet_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeVastAI]:
    with FakeVastAI(api_key=KEY, home=fleet_home / "fake", nodes="none", ready_delay_s=0) as fake:
        monkeypatch.setenv("VAST_API_KEY", KEY)
        monkeypatch.setenv("FLEET_SECRETS_FILE", str(fleet_home / "no-secrets.yml"))
        yield fake


@pytest.fixture
def ctx(redis_client: redis.Redis[str], redis_url: str, fleet_home: Path, fake: FakeVastAI) -> Any:
    from broker.app import configure

    settings = FleetSettings.model_validate(
        {"home": fleet_home, "vast_url": fake.url, "redis_url": redis_url}
    )
    configure(settings, redis_url)
    return context.init(settings, redis_url)


def served_certificate(port: int, pin: Path) -> bytes:
    """The certificate 127.0.0.1:`port` shows in a TLS handshake that trusts `pin` alone (DER)."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False  # a node is reached by address: the pin is the proof (providers.node)
    client.load_verify_locations(pin)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        client.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def plain_http_answer(port: int) -> bytes:
    """What 127.0.0.1:`port` answers to a plain HTTP request (a TLS server: no HTTP status line)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(b"GET /lab HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            return raw.recv(64)
        except OSError:
            return b""


def test_fleet_jupyter_gives_https_and_the_port_speaks_tls_with_the_pinned_certificate(
    ctx: context.Context, fake: FakeVastAI, fleet_home: Path, redis_url: str
) -> None:
    run = ledger_run("j1", SECTION)
    run.instance = run.instance_name
    ctx.ledger.create_run(run, [])
    provider = ctx.provider("vastai")
    provider.launch(LaunchRequest(run.instance_name, "j1", SECTION))
    ctx.ledger.put_instance(
        Instance(name=run.instance_name, provider="vastai", run_id="j1", state=InstanceState.RUNNING)
    )
    (inst,) = fake.instances.values()
    deadline = time.monotonic() + 10
    while inst.state != "running":  # the fake moves an instance on when it is listed
        assert time.monotonic() < deadline, "the instance never ran"
        provider.get(run.instance_name)
        time.sleep(0.05)
    # The node's start script puts JupyterLab on loopback, behind the TLS front (as the fake's node has it).
    assert f"--ip=127.0.0.1 --port={INNER_JUPYTER_PORT} " in inst.env[ACCESS_ENV]
    assert "--ip=0.0.0.0" not in inst.env[ACCESS_ENV]

    (fleet_home / "settings.yml").write_text("{}\n")
    env = {
        "REDIS_URL": redis_url,
        "FLEET_HOME": str(fleet_home),
        "FLEET_SETTINGS_FILE": str(fleet_home / "settings.yml"),
        "VAST_URL": fake.url,
        "VAST_API_KEY": KEY,
    }
    shown = CliRunner().invoke(cli, ["jupyter", "j1"], env=env)
    assert shown.exit_code == 0, shown.output
    port = inst.extra["host_ports"][JUPYTER_PORT]
    token = provider.tokens.jupyter(run.instance_name)
    assert shown.stdout.strip() == f"https://127.0.0.1:{port}/lab?token={token}"

    pin = provider.pinned_certificate(run.instance_name)
    assert pin is not None and pin.parent == fleet_home / "secrets" / "nodes"
    der = served_certificate(port, pin)  # TLS, and the certificate is the pinned one
    assert hashlib.sha256(der).hexdigest() == fingerprint(pin)
    assert not plain_http_answer(port).startswith(b"HTTP/")  # and nothing but TLS
    # The browser user is told which certificate to accept: its SHA-256 fingerprint as browsers show it.
    printed = re.search(
        r"SHA-256 fingerprint ((?:[0-9A-F]{2}:){31}[0-9A-F]{2})", " ".join(shown.stderr.split())
    )
    assert printed is not None, shown.stderr
    assert printed.group(1).replace(":", "").lower() == fingerprint(pin)
    assert str(pin) in "".join(shown.stderr.split())

    as_json = CliRunner().invoke(cli, ["jupyter", "j1", "--json"], env=env)
    assert as_json.exit_code == 0, as_json.output
    assert f'"certificate": "{pin}"' in as_json.stdout and f'"sha256": "{printed.group(1)}"' in as_json.stdout


class _Named(http.server.BaseHTTPRequestHandler):
    """Answers every GET with the name of the server it belongs to."""

    def do_GET(self) -> None:
        body = self.server.name.encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def named_server(name: str) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Named)
    server.name = name  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


def test_the_nodes_tls_front_passes_the_jobs_api_and_jupyterlab_through(tmp_path: Path) -> None:
    """providers.onnode.tlsfront as the start script runs it (`python3 -c`, the shipped source), with a pair
    of ports per service; stand-ins for the dashboard and JupyterLab listen on loopback behind it."""
    cert, key = self_signed("tf-front-1")
    pin = tmp_path / "node.crt"
    pin.write_text(cert)
    dashboard, lab = named_server("dashboard"), named_server("jupyterlab")
    jobs_port, lab_port = unused_port(), unused_port()
    _python3, dash_c, loader, *_ = tlsfront_argv()
    argv = [sys.executable, dash_c, loader]
    argv += [str(jobs_port), str(dashboard.server_address[1]), str(lab_port), str(lab.server_address[1])]
    env = {
        **os.environ,
        tlsfront.CERT_ENV: tlsfront.env_value(cert),
        tlsfront.KEY_ENV: tlsfront.env_value(key),
    }
    front = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    try:
        answers = {port: fetch(port, pin) for port in (jobs_port, lab_port)}
    finally:
        front.kill()
        stderr = front.communicate(timeout=10)[1]
        dashboard.shutdown()
        lab.shutdown()
    assert answers == {jobs_port: "dashboard", lab_port: "jupyterlab"}, stderr


def fetch(port: int, pin: Path) -> str | None:
    """GET / over TLS at `port`, trusting `pin` alone, once the front listens there; None when nothing
    serves TLS there within 10 s."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.load_verify_locations(pin)
    deadline = time.monotonic() + 10
    while True:
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
                client.wrap_socket(raw) as tls,
            ):
                tls.sendall(b"GET / HTTP/1.0\r\nHost: node\r\n\r\n")
                reply = b""
                while chunk := tls.recv(4096):
                    reply += chunk
            return reply.split(b"\r\n\r\n", 1)[1].decode()
        except (ConnectionRefusedError, ssl.SSLEOFError):
            if time.monotonic() > deadline:
                return None
            time.sleep(0.1)
