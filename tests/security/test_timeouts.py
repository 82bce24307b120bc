"""Finding 10, its timeouts part (issue 19): a node or a provider API that takes the connection and never
answers costs a worker a timeout from the settings, as the retryable error of its kind, never a hang.

The servers are real sockets on loopback: one that accepts and never answers, and a Ray head that answers
everything but the upload of a job's files (it reads the upload and says nothing). The clients are the
fleet's own, built from Settings as the workers build them.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pydantic import SecretStr

from core.errors import NodeError, ProviderUnavailable
from core.secrets import Secrets
from core.settings import Settings
from providers.base import NodeEndpoint
from providers.node import NodeClient, NodeTimeouts
from providers.registry import FleetSettings
from providers.world import World

pytestmark = pytest.mark.timeout(20)  # without timeouts these calls never return: fail, not hang

TIMEOUT_S = 1.0
WITHIN_S = 10.0  # the timeout, and room for a loaded machine (below the old defaults: 30 s, or none)


@pytest.fixture
def silent() -> Iterator[str]:
    """A server that accepts every connection and never answers (nor closes it); its http:// URL."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(2)
    for conn in held:
        conn.close()
    server.close()


class _StuckUploadHead(BaseHTTPRequestHandler):
    """A Ray head's Jobs API that knows no job and no package, and never answers an upload."""

    stop = threading.Event()

    def do_GET(self) -> None:
        if self.path == "/api/version":
            self._json(200, {"version": "4", "ray_version": "2.60.0", "ray_commit": "x"})
        else:
            self._json(404, {"error": "not found"})

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.stop.wait(60)  # took the upload; never says so

    def _json(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


@pytest.fixture
def stuck_upload_head() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StuckUploadHead)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    _StuckUploadHead.stop.set()
    server.shutdown()
    server.server_close()


def settings(home: Path, **kw: object) -> Settings:
    return FleetSettings.model_validate(
        {
            "home": home,
            "api_connect_timeout_s": TIMEOUT_S,
            "node_api_timeout_s": TIMEOUT_S,
            "provider_api_timeout_s": TIMEOUT_S,
            "upload_timeout_s": TIMEOUT_S,
            **kw,
        }
    )


def test_a_node_that_never_answers_is_a_node_error_within_the_timeout(silent: str, fleet_home: Path) -> None:
    import ray.job_submission  # noqa: F401 - imported before the clock starts: slow on a loaded machine

    began = time.monotonic()
    with pytest.raises(NodeError, match="does not answer"):
        NodeClient(NodeEndpoint(silent, silent, {}), NodeTimeouts.of(settings(fleet_home)))
    assert time.monotonic() - began < WITHIN_S


def test_an_upload_the_node_never_answers_is_a_node_error_within_the_upload_timeout(
    stuck_upload_head: str, fleet_home: Path, tmp_path: Path
) -> None:
    """The upload has its own (longer) timeout; it is finite too. Every other call is answered here, so only
    the upload's timeout can end this one (the read timeout is long)."""
    files = tmp_path / "ship"
    files.mkdir()
    (files / "data.jsonl").write_text('{"text": "x"}\n')
    timeouts = NodeTimeouts.of(settings(fleet_home, node_api_timeout_s=120))
    client = NodeClient(NodeEndpoint(stuck_upload_head, stuck_upload_head, {}), timeouts)
    began = time.monotonic()
    with pytest.raises(NodeError, match="cannot submit job"):
        client.submit("r1-1-train", "true", {}, files)
    assert time.monotonic() - began < WITHIN_S


@pytest.mark.parametrize(
    ("provider", "credential", "url_setting"),
    [
        ("runpod", "RUNPOD_API_KEY", "runpod_api_base_url"),
        ("vastai", "VAST_API_KEY", "vast_url"),
    ],
)
def test_a_provider_api_that_never_answers_is_unavailable_within_the_timeout(
    silent: str, fleet_home: Path, provider: str, credential: str, url_setting: str
) -> None:
    """Built as a worker builds it: settings and secrets -> its world -> the provider and its wire client."""
    secrets = Secrets(values={credential: SecretStr("key-for-the-test")}, file=fleet_home / "none.yml")
    cloud = World.of(settings(fleet_home, **{url_setting: silent}), secrets).provider(provider)
    began = time.monotonic()
    with pytest.raises(ProviderUnavailable):
        cloud.list_instances()
    assert time.monotonic() - began < WITHIN_S
