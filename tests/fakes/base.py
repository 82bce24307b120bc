"""What every fake cloud shares: a threaded HTTP server, instance bookkeeping, scripted faults.

A vendor fake (RunPod, vast.ai) subclasses `FakeCloud` and implements `route`, which maps one request to
an operation name and a handler. The base class counts requests per operation, applies any scripted
fault for that operation, and serves the `/_fake/...` control endpoints (state, faults, preempt).

A vendor whose instances share a private network (RunPod's global networking) also says whose Ray cluster
an instance's node joins (`join_target`) and which root it keeps its runs under (`node_root`).

For fault-injection tests the base also keeps two witnesses in `state()`: `most_live` (per instance name,
the most instances of that name ever live at once, so a duplicate shows even after one was destroyed) and
`faults_served` (per "op:kind", the scripted faults actually applied to a request).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

from tests.fakes.faults import FaultRule
from tests.fakes.nodes import Boot, Join, NodeBackend, make_nodes
from tests.fakes.serving import Served

FAULT_KINDS = frozenset(
    {
        "500",
        "429",
        "quota",
        "timeout",
        "hang",
        "error_after_create",
        "terminate_ok_but_listed",
        "not_found",
        "stuck",
        "no_capacity",
    }
)
TOKEN_ENV = "FLEET_RAY_TOKEN"
DASHBOARD_PORT = 8265


@dataclass
class Request:
    """One HTTP request, already read."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON (None when empty)."""
        return json.loads(self.body) if self.body else None


@dataclass
class Response:
    """What to answer: status, JSON-able body, extra headers."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Response]


@dataclass
class Fault(FaultRule):
    """A cloud's scripted misbehaviour; `delay` is how long a "timeout" holds the request before carrying
    it out and answering, and how long a "hang" withholds the answer of a request it carried out at once;
    with `every` n, only every n-th request of the operation that reaches the rule is hit. A "stuck" create
    is carried out and answered, but its instance never boots (a host that hangs): it is for creates only."""

    delay: float = 0.0
    every: int = 1
    seen: int = field(default=0, init=False)  # requests of the operation this rule has seen (for `every`)

    KINDS: ClassVar[frozenset[str]] = FAULT_KINDS

    def __post_init__(self) -> None:
        self.every = max(1, self.every)
        if self.kind == "stuck" and self.op != "create":
            raise ValueError(f"fault kind 'stuck' is for the create op, not {self.op!r}")


@dataclass
class Instance:
    """One rented machine as the fake sees it; vendors render it into their own wire shape."""

    id: str
    name: str
    gpu: str
    gpu_count: int
    price_per_hour: float
    bid: float | None
    env: dict[str, str]
    created_at: float = field(default_factory=time.time)
    state: str = "starting"  # starting | running | stopped | preempted | terminated
    ready_at: float = 0.0
    running_since: float | None = None
    public_port: int | None = None
    ghost_listings: int = 0  # terminate_ok_but_listed: still shown as running this many more times
    gpu_util: float = 0.0  # what the vendor reports as its GPUs' utilization (%) while running
    stuck: bool = False  # a "stuck" create: its node is never started, so it never becomes ready
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def interruptible(self) -> bool:
        """Whether this is a spot / bid instance."""
        return self.bid is not None

    def uptime_s(self) -> int:
        """Seconds since the instance became running (0 before)."""
        return int(time.time() - self.running_since) if self.running_since else 0

    def public(self) -> dict[str, Any]:
        """The row /_fake/state shows: env names only, never values."""
        return {
            "id": self.id,
            "name": self.name,
            "state": self.state,
            "bid": self.bid,
            "gpu": self.gpu,
            "gpu_count": self.gpu_count,
            "price_per_hour": self.price_per_hour,
            "created_at": self.created_at,
            "env_keys": sorted(self.env),
        }


class _HTTPHandler(BaseHTTPRequestHandler):
    """Reads a request, hands it to the owning FakeCloud, writes the answer."""

    server: _Server
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: without it, ~40 ms a request

    def _serve(self) -> None:
        split = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        request = Request(
            method=self.command,
            path=split.path,
            query={k: v[-1] for k, v in parse_qs(split.query).items()},
            headers={k.lower(): v for k, v in self.headers.items()},
            body=self.rfile.read(length) if length else b"",
        )
        response = self.server.cloud.dispatch(request)
        payload = b"" if response.status == 204 else json.dumps(response.body).encode()  # No Content
        self.send_response(response.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for key, value in response.headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default per-request stderr line (it would print query strings with keys)."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, cloud: FakeCloud, port: int) -> None:
        self.cloud = cloud
        super().__init__(("127.0.0.1", port), _HTTPHandler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up before the answer (a "timeout" or "hang" fault) is not an error."""
        if isinstance(sys.exc_info()[1], BrokenPipeError | ConnectionResetError):
            return
        super().handle_error(request, client_address)


class FakeCloud(Served):
    """Base for a fake vendor API. Use as a context manager, or `start()` / `stop()`."""

    vendor = "fake"
    # What a preempted machine gets before it is killed (a container's stop: SIGTERM first): the vendor's
    # documented notice; 0 where there is none. `preempt` gives it; a test may set it longer.
    stop_notice_s = 0.0

    def __init__(
        self,
        api_key: str = "test-key",
        home: Path | None = None,
        nodes: str = "none",
        ready_delay_s: float = 0.2,
        port: int = 0,
        node_cpus: int = 1,
    ) -> None:
        self.api_key = api_key
        self.home = home
        self.port = port
        self.lock = threading.RLock()
        self.instances: dict[str, Instance] = {}
        self.requests: dict[str, int] = {}
        self.listed_at: list[float] = []  # when each list request came (benches count them per second)
        self.faults: list[Fault] = []
        self.most_live: dict[str, int] = {}  # name -> most instances of that name live at once
        self.faults_served: dict[str, int] = {}  # "op:kind" -> faults applied to a request
        self.nodes: NodeBackend = make_nodes(nodes, home, ready_delay_s, node_cpus)
        self._stuck = threading.local()  # `creating_stuck`: this request thread carries out a "stuck" create

    # -- lifecycle (start, url, stop, `with`: tests.fakes.serving) ----------------------------------
    def new_server(self) -> _Server:
        return _Server(self, self.port)

    def after_stop(self) -> None:
        """Stop every node this fake started."""
        self.nodes.stop_all()

    # -- knobs for in-process tests (also behind /_fake/...) ---------------------------------------
    def add_faults(self, rules: list[dict[str, Any]]) -> None:
        """Queue fault rules; they are consumed in order."""
        parsed = [Fault.from_json(rule) for rule in rules]
        with self.lock:
            self.faults.extend(parsed)

    def state(self) -> dict[str, Any]:
        """What the fake holds: live instances (env names only), request counts per operation, when each
        list request came, the most instances of each name ever live at once, and the scripted faults
        served ("op:kind" -> count)."""
        with self.lock:
            for inst in self.instances.values():
                self.refresh(inst)
            return {
                "instances": [i.public() for i in self.instances.values() if i.state != "terminated"],
                "requests": dict(self.requests),
                "listed_at": list(self.listed_at),
                "most_live": dict(self.most_live),
                "faults_served": dict(self.faults_served),
            }

    def preempt(self, instance_id: str) -> bool:
        """Take an interruptible instance back; False if unknown or on-demand. With the vendor's
        `stop_notice_s`, as a container's stop: SIGTERM to its node's first process, that long before the
        rest is killed (in the background: the call returns at once), and only then is the instance shown
        lost; without, at once."""
        with self.lock:
            inst = self.instances.get(str(instance_id))
            if inst is None or not inst.interruptible or inst.state == "terminated":
                return False
            notice_s = self.stop_notice_s
            if not notice_s:
                inst.state = "preempted"
        if not notice_s:
            self.nodes.stop(self.node_name(inst))
            return True

        def taken_back() -> None:
            self.nodes.stop(self.node_name(inst), notice_s)
            with self.lock:
                if inst.state != "terminated":
                    inst.state = "preempted"

        threading.Thread(target=taken_back, daemon=True, name=f"preempt-{inst.id}").start()
        return True

    # -- instance bookkeeping used by vendors ------------------------------------------------------
    def node_name(self, inst: Instance) -> str:
        """The node directory name for an instance."""
        return f"{self.vendor}-{inst.id}"

    def add_instance(self, inst: Instance) -> Instance:
        """Record a new instance and start its node (unless a "stuck" fault hit the create)."""
        inst.stuck = inst.stuck or bool(getattr(self._stuck, "creating_stuck", False))
        with self.lock:
            self.instances[inst.id] = inst
            self.note_live(inst.name)
        self.start_node(inst)
        return inst

    def start_node(self, inst: Instance) -> None:
        """Start the instance's node: a head of its own, or a worker of the cluster it joins; none at all
        for a stuck instance, which therefore stays starting."""
        if inst.stuck:
            return
        with self.lock:
            boot = Boot(
                inst.env.get(TOKEN_ENV),
                inst.env,
                join=self.join_target(inst),
                root=self.node_root(inst),
                resources=self.node_resources(inst),
                image=self.node_image(inst),
                ports=self.node_ports(inst),
            )
        self.nodes.start(self.node_name(inst), boot)

    def note_live(self, name: str) -> None:
        """Update `most_live` for `name` after an instance got that name (created or relabelled)."""
        with self.lock:
            live = sum(1 for i in self.instances.values() if i.name == name and i.state != "terminated")
            self.most_live[name] = max(self.most_live.get(name, 0), live)

    def refresh(self, inst: Instance) -> None:
        """Advance a starting instance to running once its node answers."""
        if inst.state != "starting":
            return
        port = self.nodes.ready_port(self.node_name(inst), inst.env.get(TOKEN_ENV))
        if port is not None:
            inst.state = "running"
            inst.running_since = time.time()
            inst.public_port = port

    def visible(self, inst: Instance) -> str | None:
        """The state a list/get call shows (None: gone), consuming a terminate_ok_but_listed listing."""
        if inst.state == "terminated":
            if inst.ghost_listings > 0:
                inst.ghost_listings -= 1
                return "running"
            return None
        self.refresh(inst)
        return inst.state

    def terminate(self, inst: Instance, keep_listed: int = 0) -> None:
        """Terminate: stop the node; optionally keep listing it as running for `keep_listed` calls."""
        inst.state = "terminated"
        inst.ghost_listings = keep_listed
        self.nodes.stop(self.node_name(inst))

    def set_stopped(self, inst: Instance) -> None:
        """User stop: the node goes away, the instance stays (and can be started again)."""
        inst.state = "stopped"
        inst.running_since = None
        self.nodes.stop(self.node_name(inst))

    def resume(self, inst: Instance) -> None:
        """Start a stopped instance again (a fresh node, which joins its head again if it is a worker)."""
        inst.state = "starting"
        self.start_node(inst)

    # -- dispatch ----------------------------------------------------------------------------------
    def take_fault(self, op: str) -> Fault | None:
        """The first queued rule for `op` (or "*") that hits this request, consumed once."""
        with self.lock:
            for fault in self.faults:
                if fault.op in (op, "*") and fault.times > 0:
                    if fault.kind == "terminate_ok_but_listed":
                        if op != "terminate":
                            continue
                        self.faults.remove(fault)  # one terminate; `times` counts later listings
                        return fault
                    fault.seen += 1
                    if fault.seen % fault.every:
                        continue
                    fault.times -= 1
                    if fault.times <= 0:
                        self.faults.remove(fault)
                    return fault
        return None

    def dispatch(self, request: Request) -> Response:
        """Control endpoints first, then auth, fault injection and the vendor's handler."""
        if request.path.startswith("/_fake/"):
            return self._control(request)
        if not self.authorized(request):
            return self.unauthorized()
        op, handler = self.route(request)
        with self.lock:
            self.requests[op] = self.requests.get(op, 0) + 1
            if op == "list":
                self.listed_at.append(time.time())
        fault = self.take_fault(op)
        if fault is None:
            return handler(request)
        with self.lock:
            served = f"{op}:{fault.kind}"
            self.faults_served[served] = self.faults_served.get(served, 0) + 1
        if fault.kind == "timeout":
            time.sleep(fault.delay)
            return handler(request)
        if fault.kind == "hang":
            response = handler(request)
            time.sleep(fault.delay)
            return response
        if fault.kind == "stuck":  # the handler runs in this thread: add_instance sees the flag
            self._stuck.creating_stuck = True
            try:
                return handler(request)
            finally:
                self._stuck.creating_stuck = False
        if fault.kind == "429":
            body = self.error_body(429, "Too many requests")
            return Response(429, body, {"Retry-After": f"{fault.retry_after:g}"})
        if fault.kind == "quota":
            return Response(429, self.quota_body(), {"Retry-After": f"{fault.retry_after:g}"})
        if fault.kind == "500":
            return Response(500, self.error_body(500, "Internal server error"))
        if fault.kind == "error_after_create":
            handler(request)
            return Response(500, self.error_body(500, "Internal server error"))
        if fault.kind == "not_found":
            return self.not_found(op)
        if fault.kind == "no_capacity":  # the create is refused: nothing is made
            return self.no_capacity()
        return self.terminate_but_list(request, fault.times)

    def bearer(self, request: Request) -> str:
        """The Bearer token of a request ('' if none)."""
        auth = request.headers.get("authorization", "")
        return auth[len("Bearer ") :] if auth.startswith("Bearer ") else ""

    def _control(self, request: Request) -> Response:
        if request.path == "/_fake/state" and request.method == "GET":
            return Response(200, self.state())
        if request.path == "/_fake/faults" and request.method == "POST":
            try:
                self.add_faults(list(request.json() or []))
            except (ValueError, KeyError, TypeError) as exc:
                return Response(400, {"error": str(exc)})
            return Response(200, {"queued": len(self.faults)})
        if request.path.startswith("/_fake/preempt/") and request.method == "POST":
            ok = self.preempt(request.path.rsplit("/", 1)[-1])
            return Response(200 if ok else 404, {"preempted": ok})
        return self.vendor_control(request) or Response(404, {"error": "no such control endpoint"})

    # -- vendor hooks ------------------------------------------------------------------------------
    def join_target(self, inst: Instance) -> Join | None:
        """Whose Ray cluster the instance's node joins (None: it runs a head of its own). Called with the
        lock held. Instances of a vendor without a private network between them (vast.ai) never join."""
        return None

    def node_resources(self, inst: Instance) -> dict[str, float]:
        """The custom Ray resources the instance's hardware gives its node (none by default)."""
        return {}

    def node_image(self, inst: Instance) -> str | None:
        """The image the instance runs, which says what Python environment its node has (None: the
        default image's; see tests.fakes.node_images)."""
        return None

    def node_ports(self, inst: Instance) -> dict[int, int]:
        """Where the instance publishes its container ports on this machine, by container port (none by
        default: the node's dashboard port is its backend's to choose)."""
        return {}

    def node_root(self, inst: Instance) -> Path | None:
        """The FLEET_NODE_ROOT the instance's node shares with others (a network volume), None for its own.
        Called with the lock held."""
        return None

    def vendor_control(self, request: Request) -> Response | None:
        """A vendor's own `/_fake/...` control endpoint for `request` (None: there is none)."""
        return None

    def authorized(self, request: Request) -> bool:
        """Whether the request carries the expected key."""
        return self.bearer(request) == self.api_key

    def unauthorized(self) -> Response:
        """The vendor's answer to a bad key."""
        return Response(401, {"error": "unauthorized"})

    def route(self, request: Request) -> tuple[str, Handler]:
        """(operation name, handler) for a request."""
        raise NotImplementedError

    def error_body(self, status: int, message: str) -> Any:
        """The vendor's error body for a failed request."""
        return {"error": message}

    def quota_body(self) -> Any:
        """The vendor's body for a spent quota (a 429 its client should not simply retry)."""
        return self.error_body(429, "Quota exceeded")

    def no_capacity(self) -> Response:
        """The vendor's answer to a create it has no machine for (nothing is made)."""
        raise NotImplementedError

    def not_found(self, op: str) -> Response:
        """The vendor's not-found answer."""
        return Response(404, {"error": "not found"})

    def terminate_but_list(self, request: Request, listings: int) -> Response:
        """Handle a terminate request that succeeds yet keeps the instance listed `listings` times."""
        raise NotImplementedError
