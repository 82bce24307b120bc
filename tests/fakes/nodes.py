"""The machines behind a fake cloud's instances: none at all, a stub that answers only the Jobs API's
version call, a light node that replays a recorded run (tests.fakes.replay), or a real local Ray head per
instance.

A backend is asked to `start` a node (returns at once), whether it is ready (`ready_port`: the local port
that the instance publishes as its container port 8265, or None while it boots) and to `stop` it.

A node may also be started as a worker of another node's Ray cluster (`join`), as the pods of one run do
over RunPod's private network; only real Ray nodes act on it, the other backends boot such a node like
any other. A `root` is the node's FLEET_NODE_ROOT when several nodes share one (a network volume).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import secrets
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from providers.local.client import LocalHeads
from tests.fakes import node_images
from trainer.progress import MARKER, NODE_ROOT_ENV
from trainer.stopnotice import NOTICE_ENV

RAY_CPUS_PER_NODE = 1  # the test machine has 2 cores
TOKEN_ENV = "FLEET_RAY_TOKEN"  # the node's Ray token (goes to the head as its token, not its env)
JOIN_WAIT_S = 180.0  # how long a joining node waits for its head to boot before it gives up
JOIN_POLL_S = 0.25


@dataclass(frozen=True)
class Join:
    """A node that starts as a worker of another node's Ray cluster (`ray start --address`).

    `head` is the node name of the head its address reaches, or None when the address leads nowhere (no
    private network between the two, no such head, a wrong port): like a container whose `ray start
    --address` keeps failing, such a node boots and shows up, but never joins any cluster."""

    head: str | None


@dataclass(frozen=True)
class Boot:
    """How an instance's machine starts: its Ray token (None: a fresh one) and environment; the cluster it
    joins (None: it runs a head of its own); the FLEET_NODE_ROOT it shares with other nodes (None: a root
    of its own); the custom Ray resources its hardware gives it (what Ray detects on a real machine,
    such as `accelerator_type:<GPU>`); its image, which says what Python environment it runs in
    (tests.fakes.node_images); and the local ports its vendor publishes its other container ports at (by
    container port: JupyterLab's), where what the node's start script serves there listens."""

    token: str | None
    env: Mapping[str, str]
    join: Join | None = None
    root: Path | None = None
    resources: Mapping[str, float] = field(default_factory=dict)
    image: str | None = None
    ports: Mapping[int, int] = field(default_factory=dict)


class NodeBackend(Protocol):
    """What a fake cloud needs from the machines behind its instances."""

    def start(self, name: str, boot: Boot) -> None:
        """Start the node for `name` in the background (returns at once), as `boot` says."""

    def ready_port(self, name: str, token: str | None) -> int | None:
        """The local port published as the node's dashboard once it is up, else None."""

    def stop(self, name: str, notice_s: float = 0.0) -> None:
        """Stop the node; idempotent. With `notice_s`, as a vendor stops a container: SIGTERM to its first
        process, and that long for it to end before the rest is killed (a node running no trainer, and so
        nothing to keep, may ignore it)."""

    def stop_all(self) -> None:
        """Stop every node this backend started."""


def unused_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class NoNodes:
    """No processes: an instance is "up" `delay_s` after it was started; its port has no listener."""

    def __init__(self, delay_s: float = 0.2) -> None:
        self.delay_s = delay_s
        self._started: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def start(self, name: str, boot: Boot) -> None:
        """Remember when the node 'booted' and pick the port it will publish (nothing runs to join)."""
        with self._lock:
            self._started[name] = (time.time(), unused_port())

    def __contains__(self, name: object) -> bool:
        """Whether the node `name` was started and not stopped since."""
        with self._lock:
            return name in self._started

    def ready_port(self, name: str, token: str | None) -> int | None:
        """The published port once `delay_s` has passed."""
        with self._lock:
            started = self._started.get(name)
        if started is None or time.time() - started[0] < self.delay_s:
            return None
        return started[1]

    def stop(self, name: str, notice_s: float = 0.0) -> None:
        """Forget the node."""
        with self._lock:
            self._started.pop(name, None)

    def stop_all(self) -> None:
        """Forget every node."""
        with self._lock:
            self._started.clear()


STUB_RAY_VERSION = importlib.metadata.version("ray")  # what a stub node says it runs
STUB_CHECK = {  # what a stub node's readiness check says: a CPU stand-in with nothing missing
    "kind": "checked",
    "python": "stub",
    "executable": "stub",
    "versions": {},
    "missing": {},
    "cuda": False,
    "gpus": 0,
    "gpu_names": [],
    "cpu_standin": True,
    "setup": None,
    "problems": [],
}


class _StubHandler(BaseHTTPRequestHandler):
    """The Jobs API's version call, and just enough of its jobs for a readiness check: a submitted
    `trainer check` job succeeds with STUB_CHECK as its log; any other job fails (no Ray runs here)."""

    server: _StubServer
    protocol_version = "HTTP/1.1"

    def _reply(self, status: int, data: Any) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorized(self) -> bool:
        length = int(self.headers.get("Content-Length") or 0)
        self.payload = json.loads(self.rfile.read(length) or b"{}") if length else {}
        if self.headers.get("Authorization") == f"Bearer {self.server.token}":
            return True
        self._reply(401, {})
        return False

    def do_GET(self) -> None:
        if not self._authorized():
            return
        path = self.path.rstrip("/")
        jobs = self.server.jobs
        parts = path.split("/")
        if path == "/api/version":  # as Ray's dashboard answers it
            self._reply(200, {"version": "4", "ray_version": STUB_RAY_VERSION, "ray_commit": "stub"})
        elif path.startswith("/api/packages/"):
            self._reply(200, {})  # "already uploaded": nothing is ever run from it
        elif len(parts) >= 4 and parts[:3] == ["", "api", "jobs"] and parts[3] in jobs:
            sid = parts[3]
            if parts[4:] == ["logs"]:
                logs = MARKER + json.dumps(STUB_CHECK) + "\n" if jobs[sid]["status"] == "SUCCEEDED" else ""
                self._reply(200, {"logs": logs})
            else:
                self._reply(200, {"type": "SUBMISSION", "submission_id": sid, **jobs[sid]})
        else:
            self._reply(404, {"error": "not found"})

    def do_PUT(self) -> None:
        if self._authorized():
            self._reply(200, {})

    def do_POST(self) -> None:
        if not self._authorized():
            return
        path = self.path.rstrip("/")
        if path == "/api/jobs":
            sid = str(self.payload.get("submission_id") or secrets.token_hex(8))
            entrypoint = str(self.payload.get("entrypoint", ""))
            checks = " trainer check " in f" {entrypoint} "
            self.server.jobs[sid] = {
                "entrypoint": entrypoint,
                "status": "SUCCEEDED" if checks else "FAILED",
                "message": "" if checks else "a stub node runs no Ray jobs",
            }
            self._reply(200, {"submission_id": sid, "job_id": None})
        elif path.endswith("/stop"):
            self._reply(200, {"stopped": False})
        else:
            self._reply(404, {"error": "not found"})

    def log_message(self, format: str, *args: Any) -> None:
        """Silent."""


class _StubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, token: str) -> None:
        self.token = token
        self.jobs: dict[str, dict[str, str]] = {}
        super().__init__(("127.0.0.1", 0), _StubHandler)


class StubNodes:
    """No Ray: each node is a small HTTP server on its published port that answers the Jobs API's
    `GET /api/version` with the node's token (401 without), `delay_s` after it was started, and passes the
    readiness check as a CPU stand-in. Enough for the provision stage to see the node ready; nothing that
    needs a real head (prepare, train) works: every other job fails."""

    def __init__(self, delay_s: float = 0.2) -> None:
        self.delay_s = delay_s
        self._started: dict[str, tuple[float, _StubServer]] = {}
        self._lock = threading.Lock()

    def start(self, name: str, boot: Boot) -> None:
        """Serve the node's stub head in a daemon thread (returns at once); a stub joins no cluster."""
        server = _StubServer(boot.token or secrets.token_hex(16))
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

    def stop(self, name: str, notice_s: float = 0.0) -> None:
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
    """A real local Ray node per instance (providers.local.client.LocalHeads under `home/nodes`): a head of
    its own, or a node that joins another instance's head. Each node keeps its runs under its own root,
    `home/node-roots/<name>`, as a rented node would, unless it is given one (shared by several nodes).

    A joining node starts in a daemon thread once its head is up (the head's pod may still be booting when
    the worker's is created). One whose address leads nowhere runs no Ray at all: it shows up after
    `delay_s`, as a container does whose `ray start --address` keeps failing."""

    def __init__(self, home: Path, cpus: int = RAY_CPUS_PER_NODE, delay_s: float = 0.2) -> None:
        self.heads = LocalHeads(home / "nodes", as_rented=True)  # SIGTERM reaches its start script's trap
        self.roots = home / "node-roots"
        self.cpus = cpus
        self._names: set[str] = set()
        self._joins: dict[str, threading.Event] = {}  # name -> set once the node is stopped
        self._stranded = NoNodes(delay_s)  # workers whose head is out of reach
        self._lock = threading.Lock()

    def start(self, name: str, boot: Boot) -> None:
        """Start a head (`cpus` CPUs) whose Ray token is the instance's FLEET_RAY_TOKEN (fresh if absent),
        with the instance's environment, as a container would have it; or, given `join`, a node that joins
        that head's cluster with the instance's own token, in the background."""
        with self._lock:
            self._names.add(name)
            self._cancel(name)
        self._stranded.stop(name)
        node_env = {k: v for k, v in boot.env.items() if not k.startswith("-") and k != TOKEN_ENV}
        # As the start script does on a rented node, but a root of its own, apart from the fleet's files.
        node_env[NODE_ROOT_ENV] = str(boot.root or self.roots / name)
        # The machine's own stop notice (its start script's default is the container's /tmp, which every
        # fake node on this machine would share): never on the root, which a volume shares between nodes.
        node_env[NOTICE_ENV] = str(self.heads.node_dir(name) / "stop-notice")
        runs = node_images.image(boot.image)  # the image's own Python environment, never the fleet's
        node_env.update(runs.env())
        runs.set_up(boot.env, Path(node_env[NODE_ROOT_ENV]))  # as its start script would, before Ray
        join = boot.join
        if join is None:
            token = boot.token or secrets.token_hex(16)
            self.heads.start(  # joinable: a pod's node listens on its network, as on a rented machine
                name,
                self.cpus,
                0,
                node_env,
                token=token,
                resources=boot.resources,
                python=runs.python,
                joinable=True,
            )
        elif join.head is None:
            self._stranded.start(name, boot)
        else:
            stopped = threading.Event()
            with self._lock:
                self._joins[name] = stopped
            args = (name, join.head, boot, node_env, stopped)
            threading.Thread(target=self._join_when_up, args=args, daemon=True, name=f"join-{name}").start()

    def _join_when_up(
        self, name: str, head: str, boot: Boot, env: dict[str, str], stopped: threading.Event
    ) -> None:
        """Wait for `head` to run and its GCS to accept, then start `name` as a node of its cluster. Gives
        up quietly when the head stops or never comes up, or when `name` is stopped meanwhile."""
        deadline = time.monotonic() + JOIN_WAIT_S
        while not stopped.wait(JOIN_POLL_S):
            if time.monotonic() > deadline:
                return
            meta = self.heads.read(head)
            if meta is None or not meta.pid:
                continue  # not launched yet
            if meta.terminated_at is not None or not self.heads.head_alive(meta):
                return
            if _accepts(meta.ports["port"]):
                break
        with self._lock:  # against stop(): either it sees this node's meta, or this sees `stopped`
            if stopped.is_set():
                return
            with contextlib.suppress(ValueError, OSError):  # the head went away after all
                python = node_images.image(boot.image).python
                self.heads.join(
                    name, head, self.cpus, 0, env, token=boot.token, resources=boot.resources, python=python
                )

    def stranded(self, name: str) -> bool:
        """Whether `name` was started as a worker whose head is out of its reach (it never joins)."""
        return name in self._stranded

    def _cancel(self, name: str) -> None:
        """Tell a pending join of `name` to give up (call with the lock held)."""
        pending = self._joins.pop(name, None)
        if pending is not None:
            pending.set()

    def ready_port(self, name: str, token: str | None) -> int | None:
        """The head's dashboard port once `GET /api/version` answers 200 with the node's token; for a node
        that joined a head, its node manager's port once its `ray start --address` runs (nothing there
        serves the Jobs API: only the head does); for one out of reach, its port after `delay_s`."""
        if name in self._stranded:
            return self._stranded.ready_port(name, token)
        meta = self.heads.read(name)
        if meta is None or not self.heads.head_alive(meta):
            return None
        if meta.head is not None:
            return meta.ports["node_manager_port"]
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

    def stop(self, name: str, notice_s: float = 0.0) -> None:
        """Stop the node's processes (and a join still waiting for its head); with `notice_s`, first a
        SIGTERM to its start script's shell, which tells the trainer (providers.bootstrap.stop_notice_lines)
        and ends Ray once the trainer kept its checkpoint, and that long for it."""
        with self._lock:
            self._cancel(name)
        self._stranded.stop(name)
        if notice_s > 0:
            self.heads.notify(name, notice_s)
        self.heads.stop(name)

    def stop_all(self) -> None:
        """Stop every node started by this backend (best effort: one failure must not leak the rest)."""
        with self._lock:
            names = sorted(self._names)
            for name in names:
                self._cancel(name)
        self._stranded.stop_all()
        for name in names:
            with contextlib.suppress(Exception):  # best-effort cleanup
                self.heads.stop(name)


def _accepts(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:`port` (a head's GCS, once it is up)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def make_nodes(kind: str, home: Path | None, delay_s: float, cpus: int = RAY_CPUS_PER_NODE) -> NodeBackend:
    """The backend for `--nodes ray|stub|replay|none`; a node created with a TLS certificate (vast.ai's)
    publishes its Jobs API only through its TLS front, as its start script arranges on a real one
    (tests.fakes.tls)."""
    from tests.fakes.tls import Fronted  # it reads this module's types

    backend: NodeBackend
    if kind == "none":
        backend = NoNodes(delay_s)
    elif kind == "stub":
        backend = StubNodes(delay_s)
    elif kind == "ray":
        if home is None:
            raise ValueError("nodes='ray' needs a home directory")
        backend = RayNodes(home, cpus, delay_s)
    elif kind == "replay":  # light nodes that replay a recorded run (tests.fakes.replay)
        from tests.fakes.replay import ReplayNodes

        backend = ReplayNodes(home, delay_s)
    else:
        raise ValueError(f"unknown nodes kind {kind!r}; valid: ray, stub, replay, none")
    return Fronted(backend)
