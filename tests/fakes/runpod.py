"""A fake of RunPod's GraphQL API (`POST /graphql`), good enough for runpod-python 1.11 unmodified.

Point the SDK at it with `RUNPOD_API_BASE_URL=<fake.url>` and `runpod.api_key = <key>`. It serves the
`gpuTypes` catalog, on-demand and spot creates, stop/resume/terminate, and the pod queries, answering
with exactly the fields the request selects. It validates the whole document against RunPod's schema
before it resolves any of it (tests.fakes.runpod_schema): a field, argument or variable that does not fit
is answered 400 with the GraphQL error, as on the real server, and nothing is done. A pod of an image the
fake does not know (tests.fakes.node_images) never boots: RunPod stops it once its pull has failed.
Like RunPod, it gives each pod its own key (`container_env`: RUNPOD_POD_ID, RUNPOD_API_KEY), which here
may terminate that pod and do nothing else. A running pod lists every port of its `ports` ("8265/http,22/tcp")
in `runtime.ports`: a TCP port on its public IP under a port of RunPod's choosing, an HTTP port behind
RunPod's proxy; only the dashboard's (8265) is served, by the fake's node, and only through the fake's
HTTPS proxy (tests.fakes.runpod_proxy: `proxy.settings()` or `GET /_fake/proxy` say how to point the
fleet at it).

Several pods can make one Ray cluster, as over RunPod's global networking (a private network between the
account's pods, each reachable at `<podId>.runpod.internal`): a pod whose env has FLEET_RAY_HEAD_ADDRESS
(`<headPodId>.runpod.internal:6379`) is a worker, and under `nodes="ray"` its node joins that head's
cluster with its own FLEET_RAY_TOKEN, when both pods were created with `globalNetwork: true`. The account's
network volumes (`add_network_volume`) are one directory each: every pod created with the same
`networkVolumeId` keeps its runs under that volume's `trainfleet` directory, so a run's nodes share them.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import secrets
import string
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from providers.bootstrap import BOOTSTRAP_ENV
from tests.fakes.base import DASHBOARD_PORT, FakeCloud, Instance, Request, Response
from tests.fakes.graphql_lite import GraphQLError, Operation, named_type, parse, project, substitute
from tests.fakes.node_images import DEFAULT_IMAGE, TEMPLATE_IMAGE, ImageRegistry, PullLogin
from tests.fakes.nodes import Join
from tests.fakes.runpod_proxy import RunPodProxy
from tests.fakes.runpod_schema import OUTPUTS, ValidationFailed, validate
from tests.fakes.runpod_volumes import PATH as VOLUMES_PATH
from tests.fakes.runpod_volumes import Volumes


@dataclass(frozen=True)
class Template:
    """A RunPod template: its image, and whether its start command runs the fleet's start script from
    $FLEET_BOOTSTRAP (the README says a template must, to be used without `image`)."""

    image: str
    runs_bootstrap: bool


TEMPLATES = {
    "tf-bootstrap": Template(DEFAULT_IMAGE, runs_bootstrap=True),
    # The proof of concept's template: axolotl's image and its own start command, which knows nothing of us.
    "758uq6u5fc": Template(TEMPLATE_IMAGE, runs_bootstrap=False),
}

NO_CAPACITY = (
    "There are no longer any instances available with the requested specifications. "
    "Please refresh and try again."
)
# id, display name, memory GB, secure, community, secure spot, community spot ($/GPU/h)
_CATALOG = [
    ("NVIDIA RTX A5000", "RTX A5000", 24, 0.27, 0.16, 0.13, 0.11),
    ("NVIDIA RTX A6000", "RTX A6000", 48, 0.49, 0.33, 0.25, 0.19),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 80, 1.64, 1.19, 0.82, 0.60),
    ("NVIDIA GeForce RTX 4090", "RTX 4090", 24, 0.69, 0.34, 0.35, 0.20),
]
# RunPod's data centers as its `dataCenters` query names them: id, name, location
DATA_CENTERS = [
    ("US-GA-1", "US-GA-1", "United States"),
    ("US-TX-3", "US-TX-3", "United States"),
    ("CA-MTL-1", "CA-MTL-1", "Canada"),
    ("EU-RO-1", "EU-RO-1", "Europe"),
    ("EU-SE-1", "EU-SE-1", "Europe"),
]
_OPS = {
    "gpuTypes": "search",
    "dataCenters": "centers",
    "podFindAndDeployOnDemand": "create",
    "podRentInterruptable": "create",
    "podTerminate": "terminate",
    "podStop": "stop",
    "podResume": "resume",
    "podBidResume": "resume",
    "myself": "list",
    "pod": "get",
}


# How long a pod whose image cannot be pulled shows RUNNING with no runtime (RunPod's host tries the pull)
# before RunPod stops it: desiredStatus EXITED, lastStatusChange "Exited by Runpod: <date>", naming no
# reason. RunPod records why (PodStopReason IMAGE_NOT_FOUND, IMAGE_PULL_ERROR) only in an email to the
# owner; the API shows neither (runpod/runpodctl internal/podstate/podstate.go, which reads what
# RunPod's backend writes).
PULL_FAILS_AFTER_S = 1.0
HEAD_ADDRESS_ENV = "FLEET_RAY_HEAD_ADDRESS"  # a worker pod's head: <headPodId>.runpod.internal:6379
PRIVATE_DOMAIN = ".runpod.internal"  # a pod's name on the global network: <podId>.runpod.internal
RAY_GCS_PORT = "6379"  # the port a head's GCS listens on inside its pod
VOLUME_ROOT = "trainfleet"  # where on a network volume the fleet's nodes keep their runs
PORT_SPEC = re.compile(r"(?P<port>\d{1,5})/(?P<kind>http|tcp|udp)")  # one entry of a pod's `ports`


def parse_ports(spec: object) -> list[tuple[int, str]]:
    """A create's `ports` ("8265/http,22/tcp"): (container port, http|tcp|udp) each, as RunPod reads them;
    anything else is refused as RunPod refuses it."""
    found: list[tuple[int, str]] = []
    for item in str(spec or "").split(","):
        match = PORT_SPEC.fullmatch(item.strip())
        if match is None or not 0 < int(match["port"]) < 65536:
            raise GraphQLError(f'Invalid ports "{spec}": expected <port>/<http|tcp|udp>, comma-separated')
        found.append((int(match["port"]), match["kind"]))
    if len({port for port, _ in found}) < len(found):
        raise GraphQLError(f'Invalid ports "{spec}": a port is listed twice')
    return found


def _past(when: object, now: float) -> bool:
    """Whether a DateTime input (checked at create: tests.fakes.runpod_schema) is at or before `now`."""
    if not isinstance(when, str):
        return False
    return dt.datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp() <= now


def _pod_id() -> str:
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(14))


class FakeRunPod(FakeCloud):
    """RunPod's GraphQL API. `stock` maps a GPU type id to how many GPUs one pod may get (0: none)."""

    vendor = "runpod"
    stop_notice_s = 5.0  # RunPod's docs: a spot pod taken back gets SIGTERM, then SIGKILL 5 s later

    def __init__(self, api_key: str = "test-key", **kwargs: Any) -> None:
        super().__init__(api_key, **kwargs)
        self.stock: dict[str, int] = {row[0]: 8 for row in _CATALOG}
        self.spot_stock: dict[str, int] = {}  # spot's own pool, where set (else the type's stock)
        self.center_stock: dict[tuple[str, str], int] = {}  # (data center, GPU type) -> GPUs, where set
        self.network_volumes = Volumes(
            frozenset(c[0] for c in DATA_CENTERS)
        )  # the account's (runpod_volumes)
        self.registry_auths: dict[str, PullLogin] = {}  # the account's container registry auths, by id
        self.templates: dict[str, Template] = dict(TEMPLATES)
        self.images = ImageRegistry()  # what a pod may run (tests.fakes.node_images); any other fails
        home = self.home if self.home is not None else Path(tempfile.mkdtemp(prefix="fake-runpod-"))
        folder = home / "proxy"
        self.proxy = RunPodProxy(self._proxied_port, folder)

    # -- RunPod's HTTPS proxy ----------------------------------------------------------------------
    def start(self) -> Self:
        """Serve the API, and the pods' ports behind the HTTPS proxy."""
        self.proxy.start()
        super().start()
        return self

    def after_stop(self) -> None:
        """Stop the proxy and every node."""
        self.proxy.stop()
        super().after_stop()

    def _proxied_port(self, pod_id: str, port: int) -> int | None:
        """The local port behind the proxy's `<pod_id>-<port>`: a running pod's dashboard, else None."""
        with self.lock:
            inst = self.instances.get(pod_id)
            if inst is None or port != DASHBOARD_PORT:
                return None
            self.refresh(inst)
            if inst.state != "running":
                return None
            return inst.public_port

    def refresh(self, inst: Instance) -> None:
        """RunPod's own deadlines before the usual start: a pod past its `terminateAfter` is terminated
        (its node stopped, whoever is looking), one past its `stopAfter` stopped, as RunPod does; one whose
        image cannot be pulled is stopped by RunPod once its pull has failed (PULL_FAILS_AFTER_S)."""
        now = time.time()
        pull_failed = inst.extra.get("pull_error") and now - inst.extra["pull_started"] >= PULL_FAILS_AFTER_S
        if inst.state != "terminated" and _past(inst.extra.get("terminateAfter"), now):
            self.terminate(inst)
        elif inst.state in ("starting", "running") and _past(inst.extra.get("stopAfter"), now):
            self.set_stopped(inst)
        elif inst.state == "starting" and pull_failed:
            self.set_stopped(inst)
            inst.extra["last_status_change"] = f"Exited by Runpod: {time.ctime(now)}"
        else:
            super().refresh(inst)

    def register_image(self, name: str, like: str = DEFAULT_IMAGE) -> None:
        """Let pods run the image `name` (its nodes the environment of the known image `like`)."""
        self.images.register(name, like)

    def set_stock(self, gpu_type_id: str, gpus: int) -> None:
        """Script capacity: creates asking for more than `gpus` of this type fail with NO_CAPACITY."""
        self.stock[gpu_type_id] = gpus

    def set_spot_stock(self, gpu_type_id: str, gpus: int) -> None:
        """Script spot capacity: spot creates asking for more than `gpus` of this type fail with
        NO_CAPACITY (RunPod's spot and on-demand machines are separate pools); on-demand ones go on."""
        self.spot_stock[gpu_type_id] = gpus

    def add_registry_auth(self, user: str, token: str) -> str:
        """A container registry auth saved on the account (RunPod's saveRegistryAuth): its id. It names no
        registry: a pod that names it logs in to its own image's."""
        auth_id = "cr" + secrets.token_hex(8)
        self.registry_auths[auth_id] = PullLogin(None, user, token)
        return auth_id

    def set_center_stock(self, data_center: str, gpu_type_id: str, gpus: int) -> None:
        """Script one data center's capacity: creates there (`dataCenterId`) asking for more than `gpus` of
        this type fail with NO_CAPACITY; elsewhere, and a create that names no data center, go on."""
        self.center_stock[(data_center, gpu_type_id)] = gpus

    def add_network_volume(self, volume_id: str, data_center: str = "EU-RO-1") -> None:
        """Give the account a network volume, which pods may then be created with (`networkVolumeId`).
        Under `home` it is the directory `volumes/<volume_id>`, shared by every pod that mounts it."""
        with self.lock:
            self.network_volumes.add(volume_id, data_center)
        if self.home is not None:
            self.volume_dir(volume_id).mkdir(parents=True, exist_ok=True)

    @property
    def rest_url(self) -> str:
        """Where the fake serves RunPod's REST API (the fleet's runpod_rest_url)."""
        return f"{self.url}/v1"

    def volume_dir(self, volume_id: str) -> Path:
        """Where a network volume's files are (needs `home`)."""
        if self.home is None:
            raise ValueError("network volume directories need a home directory")
        return self.home / "volumes" / volume_id

    # -- multi-node: global networking and network volumes (base class hooks) -----------------------
    def join_target(self, inst: Instance) -> Join | None:
        """A pod with FLEET_RAY_HEAD_ADDRESS joins its head's cluster. Its address reaches the head only
        over the global network (both pods created with `globalNetwork: true`), only when it names a live
        pod of this account that runs a head, and only on the GCS's port; else `Join(None)`: never joins."""
        address = inst.env.get(HEAD_ADDRESS_ENV)
        if address is None:
            return None
        host, _, port = address.rpartition(":")
        on_network = host.endswith(PRIVATE_DOMAIN)
        head = self.instances.get(host.removesuffix(PRIVATE_DOMAIN)) if on_network else None
        reachable = (
            head is not None
            and head is not inst
            and head.state != "terminated"
            and HEAD_ADDRESS_ENV not in head.env
            and port == RAY_GCS_PORT
            and inst.extra.get("globalNetwork") is True
            and head.extra.get("globalNetwork") is True
        )
        return Join(self.node_name(head) if reachable and head is not None else None)

    def node_resources(self, inst: Instance) -> dict[str, float]:
        """A GPU pod's node offers what Ray advertises on such a GPU, `accelerator_type:<type>` (named by
        Ray's own rule: "NVIDIA RTX A5000" gives RTX-A5000), though the fake's node has no GPU: a job may pin
        its workers to a GPU type with it, as on RunPod."""
        from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager

        kind = NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(inst.gpu) if inst.gpu_count else None
        return {f"accelerator_type:{kind}": 1.0} if kind else {}

    def node_root(self, inst: Instance) -> Path | None:
        """A pod with a network volume keeps its runs on it (the same directory for every such pod)."""
        volume = inst.extra.get("networkVolumeId")
        if volume is None or self.home is None:
            return None
        return self.volume_dir(str(volume)) / VOLUME_ROOT

    def vendor_control(self, request: Request) -> Response | None:
        """`POST /_fake/network-volumes {"id": ..., "dataCenterId": ...}`: `add_network_volume`, for a fake
        served on its own (`python -m tests.fakes serve runpod`); `GET /_fake/proxy`: `proxy.settings()`;
        `POST /_fake/images {"name": ..., "like": ...}`: `register_image`."""
        if request.path == "/_fake/proxy" and request.method == "GET":
            return Response(200, self.proxy.settings())
        if request.path == "/_fake/images" and request.method == "POST":
            return Response(*self.images.register_from(request.json()))
        if request.path != "/_fake/network-volumes" or request.method != "POST":
            return None
        body = request.json() or {}
        if not isinstance(body, dict) or not body.get("id"):
            return Response(400, {"error": 'expected {"id": ..., "dataCenterId": ...}'})
        self.add_network_volume(str(body["id"]), str(body.get("dataCenterId") or "EU-RO-1"))
        return Response(200, {"network_volumes": sorted(self.network_volumes)})

    # -- HTTP --------------------------------------------------------------------------------------
    def authorized(self, request: Request) -> bool:
        """The account's key; or a pod's own key (RUNPOD_API_KEY inside it), for terminating that pod only."""
        key = self.bearer(request)
        if key == self.api_key:
            return True
        with self.lock:
            pods = {str(i.extra.get("pod_api_key")): i.id for i in self.instances.values()}
        return bool(key) and key in pods and self._terminates(request) == pods[key]

    def _terminates(self, request: Request) -> str | None:
        """The pod id a request terminates, when it is one podTerminate and nothing else."""
        try:
            body = request.json() or {}
            operation = parse(str(body.get("query", "")))
            (top,) = operation.fields
            args = substitute(top.args, dict(body.get("variables") or {}))
        except (GraphQLError, ValueError, TypeError, AttributeError):
            return None
        if operation.kind != "mutation" or top.name != "podTerminate":
            return None
        return str((args.get("input") or {}).get("podId") or "")

    def node_image(self, inst: Instance) -> str | None:
        """The image whose environment the pod's node runs (a pod with an image no one knows never boots)."""
        return self.images.runs_as(inst.extra.get("imageName"))

    def container_env(self, pod_id: str) -> dict[str, str]:
        """What RunPod puts in a pod's environment about itself: its id and its own, pod-scoped API key."""
        with self.lock:
            inst = self.instances[pod_id]
            return {"RUNPOD_POD_ID": inst.id, "RUNPOD_API_KEY": str(inst.extra["pod_api_key"])}

    def unauthorized(self) -> Response:
        """RunPod answers a bad key with HTTP 401."""
        return Response(401, {"errors": [{"message": "Unauthorized"}]})

    def error_body(self, status: int, message: str) -> Any:
        """GraphQL-style error body."""
        return {"errors": [{"message": message, "extensions": {"code": "INTERNAL_SERVER_ERROR"}}]}

    def no_capacity(self) -> Response:
        """RunPod's answer to a create with no machine for it (HTTP 200 with an error entry)."""
        return Response(200, {"errors": [{"message": NO_CAPACITY}], "data": None})

    def not_found(self, op: str) -> Response:
        """RunPod's not-found answer (HTTP 200 with an error entry)."""
        message = "pod not found to terminate" if op == "terminate" else "pod not found"
        return Response(200, {"errors": [{"message": message}], "data": None})

    def route(self, request: Request) -> tuple[str, Any]:
        """Parse the GraphQL request; the operation is its first top-level field. The REST API's network
        volumes (tests.fakes.runpod_volumes) are operation `volumes`."""
        if request.path.startswith(VOLUMES_PATH):
            return "volumes", lambda r: self._volumes(r)
        if request.method != "POST" or request.path.rstrip("/") != "/graphql":
            return "other", lambda _r: Response(404, {"errors": [{"message": "Not Found"}]})
        try:
            body = request.json() or {}
            operation = parse(str(body.get("query", "")))
            variables = dict(body.get("variables") or {})
        except (GraphQLError, ValueError, TypeError, AttributeError) as exc:
            error = Response(400, {"errors": [{"message": str(exc)}]})
            return "graphql", lambda _r: error
        op = _OPS.get(operation.fields[0].name, "graphql") if operation.fields else "graphql"
        return op, lambda _r: self._execute(operation, variables)

    def _volumes(self, request: Request) -> Response:
        with self.lock:
            live = [i for i in self.instances.values() if i.state != "terminated"]
            mounts = {str(i.extra.get("networkVolumeId")) for i in live}
            return self.network_volumes.handle(request, lambda volume_id: volume_id in mounts)

    def terminate_but_list(self, request: Request, listings: int) -> Response:
        """Terminate for real but keep listing the pod as RUNNING for `listings` list/get calls."""
        body = request.json() or {}
        operation = parse(str(body.get("query", "")))
        args = substitute(operation.fields[0].args, dict(body.get("variables") or {}))
        with self.lock:
            inst = self._find(args)
            self.terminate(inst, keep_listed=listings)
        return Response(200, {"data": {"podTerminate": None}})

    def _execute(self, operation: Operation, variables: dict[str, Any]) -> Response:
        """Validate the whole document against RunPod's schema (tests.fakes.runpod_schema), then resolve
        its fields in order. A document RunPod would refuse is answered 400 before any resolver runs, so
        nothing is created, stopped or terminated for it."""
        try:
            validate(operation, variables)
        except ValidationFailed as exc:
            error = {"message": str(exc), "extensions": {"code": exc.code}}
            return Response(400, {"errors": [error]})
        kind = "Mutation" if operation.kind == "mutation" else "Query"
        roots = self._mutations() if operation.kind == "mutation" else self._queries()
        data: dict[str, Any] = {}
        try:
            for sel in operation.fields:
                if not sel.selected(variables):
                    continue
                if sel.name == "__typename":
                    data[sel.key] = kind
                    continue
                with self.lock:
                    value = roots[sel.name](substitute(sel.args, variables))
                type_name = named_type(OUTPUTS[kind][sel.name])
                data[sel.key] = project(value, sel.selections, variables, type_name, OUTPUTS)
        except GraphQLError as exc:
            return Response(200, {"errors": [{"message": str(exc), "path": [sel.key]}], "data": None})
        return Response(200, {"data": data})

    # -- resolvers ---------------------------------------------------------------------------------
    def _queries(self) -> dict[str, Any]:
        return {
            "gpuTypes": self._gpu_types,
            "myself": self._myself,
            "pod": self._pod,
            "dataCenters": lambda _args: [
                {"id": i, "name": n, "location": where, "storageSupport": True}
                for i, n, where in DATA_CENTERS
            ],
        }

    def _mutations(self) -> dict[str, Any]:
        return {
            "podFindAndDeployOnDemand": lambda a: self._create(a, spot=False),
            "podRentInterruptable": lambda a: self._create(a, spot=True),
            "podTerminate": self._terminate,
            "podStop": self._stop,
            "podResume": self._resume,
            "podBidResume": self._resume,
        }

    def _gpu_types(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        wanted = (args.get("input") or {}).get("id")
        return [self._gpu(row) for row in _CATALOG if wanted in (None, row[0])]

    def _gpu(self, row: tuple[str, str, int, float, float, float, float]) -> dict[str, Any]:
        gpu_id, display, memory, secure, community, secure_spot, community_spot = row
        lowest = {
            "minimumBidPrice": min(secure_spot, community_spot),
            "uninterruptablePrice": min(secure, community),
            "stockStatus": "High" if self.stock.get(gpu_id, 0) else None,
        }
        return {
            "id": gpu_id,
            "displayName": display,
            "manufacturer": "Nvidia",
            "memoryInGb": memory,
            "cudaCores": 0,
            "maxGpuCount": 8,
            "secureCloud": True,
            "communityCloud": True,
            "securePrice": secure,
            "communityPrice": community,
            "secureSpotPrice": secure_spot,
            "communitySpotPrice": community_spot,
            "oneMonthPrice": None,
            "threeMonthPrice": None,
            "oneWeekPrice": None,
            "lowestPrice": lambda _args: lowest,  # its arguments were checked with the document
        }

    def _create(self, args: dict[str, Any], spot: bool) -> dict[str, Any]:
        spec = dict(args.get("input") or {})
        gpu_id = str(spec.get("gpuTypeId") or "")
        row = next((r for r in _CATALOG if r[0] == gpu_id), None)
        if row is None:
            raise GraphQLError(f"Invalid gpuTypeId: {gpu_id!r}")
        count = int(spec.get("gpuCount") or 1)
        if count > self.stock.get(gpu_id, 0):
            raise GraphQLError(NO_CAPACITY)
        if spot and count > self.spot_stock.get(gpu_id, self.stock.get(gpu_id, 0)):
            raise GraphQLError(NO_CAPACITY)
        center = spec.get("dataCenterId")
        if center is not None and str(center) not in {c[0] for c in DATA_CENTERS}:
            raise GraphQLError(f"Invalid dataCenterId: {center!r}")
        if center is not None and count > self.center_stock.get((str(center), gpu_id), count):
            raise GraphQLError(NO_CAPACITY)
        cloud = str(spec.get("cloudType") or "ALL")
        on_demand = {"SECURE": row[3], "COMMUNITY": row[4]}.get(cloud, min(row[3], row[4]))
        bid: float | None = None
        if spot:
            if spec.get("bidPerGpu") is None:
                raise GraphQLError("bidPerGpu is required")
            bid = float(spec["bidPerGpu"])
            if bid < min(row[5], row[6]):
                raise GraphQLError(f"Bid {bid} is below the minimum bid price {min(row[5], row[6])}.")
        volume = spec.get("networkVolumeId")
        if volume is not None and str(volume) not in self.network_volumes:
            raise GraphQLError(f"network volume {volume} not found")
        env = {str(e["key"]): str(e["value"]) for e in spec.get("env") or []}
        ports = parse_ports(spec.get("ports") or f"{DASHBOARD_PORT}/http")
        stuck = False
        if spec.get("templateId"):  # the template gives the image and the start command, unless overridden
            template = self.templates.get(str(spec["templateId"]))
            if template is None:
                raise GraphQLError(f"template {spec['templateId']} not found")
            spec.setdefault("imageName", template.image)
            # Its start command runs ours only if it says so (and no dockerArgs replace it): else no Ray.
            stuck = not (template.runs_bootstrap and BOOTSTRAP_ENV in env) and not spec.get("dockerArgs")
        auth = spec.get("containerRegistryAuthId")
        if auth is not None and str(auth) not in self.registry_auths:  # (RunPod's words are not known)
            raise GraphQLError(f"container registry auth {auth} not found")
        login = self.registry_auths.get(str(auth)) if auth is not None else None
        # an image no one has, or a private one without its login: it never boots
        pull_error = self.images.pull_error(spec.get("imageName"), login)
        inst = Instance(
            id=_pod_id(),
            name=str(spec.get("name") or ""),
            gpu=gpu_id,
            gpu_count=count,
            price_per_hour=round((bid if bid is not None else on_demand) * count, 4),
            bid=bid,
            env=env,
            extra={
                **{k: v for k, v in spec.items() if k not in ("env", "name")},
                "pod_api_key": secrets.token_hex(16),
                # A TCP port is published on the pod's public IP under a port of RunPod's choosing.
                "public_ports": {p: 10_000 + secrets.randbelow(50_000) for p, kind in ports if kind == "tcp"},
                **({"pull_error": pull_error, "pull_started": time.time()} if pull_error else {}),
            },
        )
        inst.stuck = stuck or pull_error is not None
        self.add_instance(inst)
        return self._render(inst, inst.state)

    def _find(self, args: dict[str, Any], message: str = "pod not found") -> Instance:
        pod_id = str((args.get("input") or {}).get("podId") or args.get("podId") or "")
        inst = self.instances.get(pod_id)
        if inst is None or inst.state == "terminated":
            raise GraphQLError(message)
        return inst

    def _terminate(self, args: dict[str, Any]) -> None:
        self.terminate(self._find(args, "pod not found to terminate"))

    def _stop(self, args: dict[str, Any]) -> dict[str, Any]:
        inst = self._find(args)
        self.set_stopped(inst)
        return self._render(inst, inst.state)

    def _resume(self, args: dict[str, Any]) -> dict[str, Any]:
        inst = self._find(args)
        bid = (args.get("input") or {}).get("bidPerGpu")
        if bid is not None:
            inst.bid = float(bid)
        if inst.extra.get("pull_error"):  # its host tries the pull again, and fails again
            inst.extra["pull_started"] = time.time()
        inst.extra.pop("last_status_change", None)
        self.resume(inst)
        return self._render(inst, inst.state)

    def _myself(self, args: dict[str, Any]) -> dict[str, Any]:
        pods = []
        for inst in list(self.instances.values()):
            shown = self.visible(inst)
            if shown is not None:
                pods.append(self._render(inst, shown))
        volumes = self.network_volumes.rows()
        return {"id": "user-fake", "pubKey": None, "pods": pods, "networkVolumes": volumes}

    def _pod(self, args: dict[str, Any]) -> dict[str, Any] | None:
        pod_id = str((args.get("input") or {}).get("podId") or "")
        inst = self.instances.get(pod_id)
        shown = self.visible(inst) if inst is not None else None
        return self._render(inst, shown) if inst is not None and shown is not None else None

    def _other_ports(self, inst: Instance) -> list[dict[str, Any]]:
        """The pod's published ports besides the dashboard's (which the fake's node serves on this
        machine): a TCP port on the public IP at its mapped port (nothing listens there), an HTTP port
        behind RunPod's proxy (on the pod's private address)."""
        rows = []
        for port, kind in parse_ports(inst.extra.get("ports") or f"{DASHBOARD_PORT}/http"):
            if port == DASHBOARD_PORT:
                continue
            public = kind != "http"
            rows.append(
                {
                    "ip": "127.0.0.1" if public else "100.65.0.2",
                    "isIpPublic": public,
                    "privatePort": port,
                    "publicPort": inst.extra.get("public_ports", {}).get(port) if public else port,
                    "type": kind,
                }
            )
        return rows

    def _render(self, inst: Instance, shown: str) -> dict[str, Any]:
        """The pod as RunPod's `Pod` type, for the state a caller sees."""
        running = shown == "running"
        extra = inst.extra
        rented = time.ctime(inst.created_at)
        runtime = None
        if running:
            ports = [
                {
                    "ip": "127.0.0.1",
                    "isIpPublic": True,
                    "privatePort": DASHBOARD_PORT,
                    "publicPort": inst.public_port,
                    "type": "http",
                },
                *self._other_ports(inst),
            ]
            runtime = {
                "uptimeInSeconds": inst.uptime_s(),
                "ports": ports,
                "gpus": [
                    {"id": f"GPU-{i}", "gpuUtilPercent": inst.gpu_util, "memoryUtilPercent": 0}
                    for i in range(inst.gpu_count)
                ],
                "container": {"cpuPercent": 0, "memoryPercent": 0},
            }
        return {
            "id": inst.id,
            "name": inst.name,
            "desiredStatus": "RUNNING" if shown in ("starting", "running") else "EXITED",
            "costPerHr": inst.price_per_hour,
            "bidPerGpu": inst.bid,
            "podType": "INTERRUPTABLE" if inst.interruptible else "RESERVED",
            "gpuCount": inst.gpu_count,
            "imageName": extra.get("imageName", ""),
            "env": [f"{k}={v}" for k, v in inst.env.items()],
            "containerDiskInGb": extra.get("containerDiskInGb", 10),
            "volumeInGb": extra.get("volumeInGb", 0),
            "volumeMountPath": extra.get("volumeMountPath", "/runpod-volume"),
            "dockerArgs": extra.get("dockerArgs", ""),
            "dockerId": None,
            "ports": extra.get("ports", f"{DASHBOARD_PORT}/http"),
            "port": None,
            "memoryInGb": 62,
            "vcpuCount": 8,
            "machineId": f"m-{inst.id[:8]}",
            "machine": {"gpuDisplayName": inst.gpu.replace("NVIDIA ", ""), "podHostId": f"{inst.id}-host"},
            "lastStatusChange": extra.get("last_status_change") or f"Rented by User: {rented}",
            "uptimeSeconds": inst.uptime_s(),
            "globalNetwork": extra.get("globalNetwork") is True,
            "networkVolumeId": extra.get("networkVolumeId"),
            "runtime": runtime,
        }


def graphql_body(query: str, variables: dict[str, Any] | None = None) -> bytes:
    """A GraphQL request body (for tests that talk to the fake without the SDK)."""
    return json.dumps({"query": query, "variables": variables or {}}).encode()


def proxy_settings(url: str) -> dict[str, str]:
    """The fleet's settings for the proxy of the fake RunPod at `url` (one served in its own process)."""
    with urllib.request.urlopen(f"{url}/_fake/proxy", timeout=10) as reply:
        return {str(k): str(v) for k, v in json.loads(reply.read()).items()}
