"""The machines behind a fake cloud's instances: none at all, a stub that answers only the Jobs API's
version call, or a real local Ray head per instance.

A backend is asked to `start` a node (returns at once), whether it is ready (`ready_port`: the local port
that the instance publishes as its container port 8265, or None while it boots) and to `stop` it.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from providers.local.client import LocalHeads
from trainer.config import NODE_ROOT_ENV

RAY_CPUS_PER_NODE = 1  # the test machine has 2 cores
TOKEN_ENV = "FLEET_RAY_TOKEN"  # the node's Ray token (goes to the head as its token, not its env)


class NodeBackend(Protocol):
    """What a fake cloud needs from the machines behind its instances."""

    def start(self, name: str, token: str | None, env: Mapping[str, str]) -> None:
        """Start the node for `name` in the background (returns at once), with the instance's `env`."""

    def ready_port(self, name: str, token: str | None) -> int | None:
        """The local port published as the node's dashboard once it is up, else None."""

    def stop(self, name: str) -> None:
        """Stop the node; idempotent."""

    def stop_all(self) -> None:
        """Stop every node this backend started."""


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class NoNodes:
    """No processes: an instance is "up" `delay_s` after it was started; its port has no listener."""

    def __init__(self, delay_s: float = 0.2) -> None:
        self.delay_s = delay_s
        self._started: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def start(self, name: str, token: str | None, env: Mapping[str, str]) -> None:
        """Remember when the node 'booted' and pick the port it will publish."""
        with self._lock:
            self._started[name] = (time.time(), _unused_port())

    def ready_port(self, name: str, token: str | None) -> int | None:
        """The published port once `delay_s` has passed."""
        with self._lock:
            started = self._started.get(name)
        if started is None or time.time() - started[0] < self.delay_s:
            return None
        return started[1]

    def stop(self, name: str) -> None:
        """Forget the node."""
        with self._lock:
            self._started.pop(name, None)

    def stop_all(self) -> None:
        """Forget every node."""
        with self._lock:
            self._started.clear()


class _StubHandler(BaseHTTPRequestHandler):
    server: _StubServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        ok = self.path.rstrip("/") == "/api/version"
        ok = ok and self.headers.get("Authorization") == f"Bearer {self.server.token}"
        body = b'{"version": "stub"}' if ok else b"{}"
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Silent."""


class _StubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, token: str) -> None:
        self.token = token
        super().__init__(("127.0.0.1", 0), _StubHandler)


class StubNodes:
    """No Ray: each node is a small HTTP server on its published port that answers the Jobs API's
    `GET /api/version` with the node's token (401 without), `delay_s` after it was started. Enough for the
    provision stage to see the node RUNNING; nothing that needs a real head (prepare, train) works."""

    def __init__(self, delay_s: float = 0.2) -> None:
        self.delay_s = delay_s
        self._started: dict[str, tuple[float, _StubServer]] = {}
        self._lock = threading.Lock()

    def start(self, name: str, token: str | None, env: Mapping[str, str]) -> None:
        """Serve the node's stub head in a daemon thread (returns at once)."""
        server = _StubServer(token or secrets.token_hex(16))
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        with self._lock:
            old = self._started.pop(name, None)
            self._started[name] = (time.time(), server)
        if old is not None:
            _close(old[1])

    def ready_port(self, name: str, token: str | None) -> int | None:
        """The stub's port once `delay_s` has passed."""
        with self._lock:
            started = self._started.get(name)
        if started is None or time.time() - started[0] < self.delay_s:
            return None
        return int(started[1].server_address[1])

    def stop(self, name: str) -> None:
        """Stop the node's stub server."""
        with self._lock:
            started = self._started.pop(name, None)
        if started is not None:
            _close(started[1])

    def stop_all(self) -> None:
        """Stop every stub server."""
        with self._lock:
            servers = [server for _at, server in self._started.values()]
            self._started.clear()
        for server in servers:
            _close(server)


def _close(server: _StubServer) -> None:
    server.shutdown()
    server.server_close()


class RayNodes:
    """A real local Ray head per instance (providers.local.client.LocalHeads under `home/nodes`); each
    node keeps its runs under its own root, `home/node-roots/<name>`, as a rented node would."""

    def __init__(self, home: Path, cpus: int = RAY_CPUS_PER_NODE) -> None:
        self.heads = LocalHeads(home / "nodes")
        self.roots = home / "node-roots"
        self.cpus = cpus
        self._names: set[str] = set()
        self._lock = threading.Lock()

    def start(self, name: str, token: str | None, env: Mapping[str, str]) -> None:
        """Start a head (`cpus` CPUs) whose Ray token is the instance's FLEET_RAY_TOKEN (fresh if absent),
        with the instance's environment, as a container would have it."""
        with self._lock:
            self._names.add(name)
        node_env = {k: v for k, v in env.items() if not k.startswith("-") and k != TOKEN_ENV}
        # As the start script does on a rented node, but a root of its own, apart from the fleet's files.
        node_env[NODE_ROOT_ENV] = str(self.roots / name)
        self.heads.start(name, self.cpus, num_gpus=0, env=node_env, token=token or secrets.token_hex(16))

    def ready_port(self, name: str, token: str | None) -> int | None:
        """The head's dashboard port once `GET /api/version` answers 200 with the node's token."""
        meta = self.heads.read(name)
        if meta is None or not self.heads.head_alive(meta):
            return None
        request = urllib.request.Request(
            f"{meta.dashboard_url}/api/version",
            headers={"Authorization": f"Bearer {token or self.heads.token(name)}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                ok = response.status == 200
        except (urllib.error.URLError, OSError):
            return None
        return meta.ports["dashboard_port"] if ok else None

    def stop(self, name: str) -> None:
        """Stop the head's processes."""
        self.heads.stop(name)

    def stop_all(self) -> None:
        """Stop every head started by this backend (best effort: one failure must not leak the rest)."""
        with self._lock:
            names = sorted(self._names)
        for name in names:
            with contextlib.suppress(Exception):  # best-effort cleanup
                self.heads.stop(name)


def make_nodes(kind: str, home: Path | None, delay_s: float, cpus: int = RAY_CPUS_PER_NODE) -> NodeBackend:
    """The backend for `--nodes ray|stub|none`."""
    if kind == "none":
        return NoNodes(delay_s)
    if kind == "stub":
        return StubNodes(delay_s)
    if kind == "ray":
        if home is None:
            raise ValueError("nodes='ray' needs a home directory")
        return RayNodes(home, cpus)
    raise ValueError(f"unknown nodes kind {kind!r}; valid: ray, stub, none")
