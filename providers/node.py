"""Talking to a node's Ray head through the Ray Jobs API (token in headers, never logged).

Every call names the fleet in its User-Agent, which the node's failsafe (providers.failsafe) counts as the
fleet's heartbeat: a node that hears none for `node_heartbeat_timeout_s` gives itself back.

Every call goes through `channel`: the one place that decides how the fleet may reach a node. The token
lets its holder run code on a node that holds the job's credentials, so it never crosses a network in
clear: plain HTTP is refused unless to this machine (a local head), a node's own certificate is pinned
(trusted alone, whatever its name; vast.ai), and an HTTPS proxy in front of a node is checked against the
system's authorities (or `ca_file`) and its name (RunPod's).

Every call has a timeout too, so a node that takes the connection and never answers costs a worker a
retryable NodeError, never the worker: Ray's client sends its requests with none, so NodeClient's get a
connect and a read timeout each (`NodeTimeouts`, from the settings), and the upload of a job's files a
longer read timeout.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import ssl
from dataclasses import dataclass
from enum import StrEnum
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypedDict
from urllib.parse import urlsplit

import requests
from pydantic import BaseModel, ConfigDict, ValidationError
from requests.adapters import HTTPAdapter

from core.errors import NodeError, Unreachable
from core.settings import API_CONNECT_TIMEOUT_S, NODE_API_TIMEOUT_S, UPLOAD_TIMEOUT_S, Settings
from providers import failsafe
from providers.base import NodeEndpoint, Unanswered
from providers.reach import unanswered

TRAINER_DIR = Path(__file__).resolve().parent.parent / "trainer"


class JobStatus(StrEnum):
    """A Ray job's status (the Jobs API's values)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    def is_terminal(self) -> bool:
        return self in (JobStatus.STOPPED, JobStatus.SUCCEEDED, JobStatus.FAILED)


@dataclass(frozen=True)
class JobInfo:
    status: JobStatus
    message: str
    exit_code: int | None = None
    """The entrypoint's exit code, once it exited."""
    seconds: float | None = None
    """How long the job ran (start to end, by the node's clock), once it ended."""
    never_ran: bool = False
    """Ray failed it before its command started: it could not set up the job's runtime environment (the
    trainer package or the job's files from the head's store, unpacked on the node)."""


NEVER_RAN_ERRORS = frozenset({"RUNTIME_ENV_SETUP_FAILURE"})  # Ray's JobErrorType values


LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine (127.0.0.0/8, ::1, localhost)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host.lower() in LOOPBACK_NAMES


def fingerprint(cert_file: Path) -> str:
    """The SHA-256 fingerprint of a PEM certificate (hex): what a pinned connection insists on."""
    der = ssl.PEM_cert_to_DER_cert(cert_file.read_text(encoding="ascii"))
    return hashlib.sha256(der).hexdigest()


class PinnedAdapter(HTTPAdapter):
    """TLS that trusts one certificate: it must be the chain's only one (`verify` is its file) and have
    its fingerprint. The node is reached by address, so there is no name to check: the pin is the proof."""

    def __init__(self, cert_file: Path) -> None:
        self._fingerprint = fingerprint(cert_file)
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs.update(assert_hostname=False, assert_fingerprint=self._fingerprint)
        super().init_poolmanager(*args, **kwargs)


def channel(endpoint: NodeEndpoint) -> requests.Session:
    """A session for the node's Jobs API, after the check every connection to a node passes: HTTPS (with
    the node's certificate pinned, or a proxy's checked), or plain HTTP to this machine only. NodeError
    naming the URL otherwise. The caller closes it."""
    url = endpoint.jobs_url
    parts = urlsplit(url)
    if parts.scheme == "http" and not is_loopback(parts.hostname or ""):
        raise NodeError(
            f"refusing plain HTTP to {url}: the node's token and the job's data would cross the network "
            "in clear (a rented node is reached over HTTPS only)"
        )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NodeError(f"not a node's address: {url}")
    session = requests.Session()
    session.trust_env = False  # the environment's proxies, CA bundle and .netrc have no say here
    if endpoint.tls_pin is not None:
        if not endpoint.tls_pin.is_file():
            raise NodeError(f"the certificate pinned for {url} is missing: {endpoint.tls_pin}")
        session.mount(f"{parts.scheme}://{parts.netloc}", PinnedAdapter(endpoint.tls_pin))
        session.verify = str(endpoint.tls_pin)
    elif endpoint.ca_file is not None:
        session.verify = str(endpoint.ca_file)
    return session


def reach(endpoint: NodeEndpoint, headers: dict[str, str], timeout_s: float = 2.0) -> Unanswered | None:
    """Why the node's Jobs API gives no answer with these headers (HTTP 200 on /api/version), or None when
    it answers. Never raises, but for a refused channel (NodeError): an unreachable node is the caller's
    to judge, by the cause (providers.reach)."""
    url = endpoint.jobs_url.rstrip("/")
    with channel(endpoint) as session:
        try:
            reply = session.get(f"{url}/api/version", headers=headers, timeout=timeout_s)
        except (requests.RequestException, OSError) as exc:
            return unanswered(exc, url, pinned=endpoint.tls_pin is not None)
        if reply.status_code == 200:
            return None
        return Unanswered(Unreachable.HTTP, f"HTTP {reply.status_code} {reply.reason}".strip(), url)


def answers(endpoint: NodeEndpoint, headers: dict[str, str], timeout_s: float = 2.0) -> bool:
    """Whether the node's Jobs API answers with these headers (see `reach`)."""
    return reach(endpoint, headers, timeout_s) is None


def jobs_api_answers(url: str, headers: dict[str, str], timeout_s: float = 2.0) -> bool:
    """Whether a local Ray head's Jobs API at `url` answers with the node's token (see `answers`)."""
    return answers(NodeEndpoint(url, url, headers), headers, timeout_s)


@functools.cache
def user_agent() -> str:
    """`trainfleet/<version> heartbeat`: how the fleet names itself to a node."""
    return failsafe.USER_AGENT.format(version=version("trainfleet"))


def fleet_headers(endpoint: NodeEndpoint) -> dict[str, str]:
    """The node's token headers, and the fleet's User-Agent (a heartbeat to the node's failsafe)."""
    return {**endpoint.headers, "User-Agent": user_agent()}


def ping(endpoint: NodeEndpoint, timeout_s: float = 5.0) -> bool:
    """A heartbeat to the node's failsafe (GET /api/version with the node's token); whether the head
    answered. Never raises but NodeError for a channel `channel` refuses."""
    return answers(endpoint, fleet_headers(endpoint), timeout_s)


def _get_json(endpoint: NodeEndpoint, path: str, timeout_s: float = 10.0) -> Any:
    url = f"{endpoint.jobs_url.rstrip('/')}{path}"
    with channel(endpoint) as session:
        try:
            reply = session.get(url, headers=fleet_headers(endpoint), timeout=timeout_s)
            reply.raise_for_status()
            return reply.json()
        except (requests.RequestException, OSError, ValueError) as exc:
            raise NodeError(f"the node's Ray head did not answer {path}: {exc}") from None


class RayNode(BaseModel):
    """One node of a Ray cluster, as the head's State API lists it (`ray list nodes`); the fields the fleet
    reads (Ray sends more, and null for what it does not know)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    node_id: str | None = None
    node_ip: str | None = None
    is_head_node: bool | None = None
    state: str | None = None
    """ALIVE or DEAD."""
    resources_total: dict[str, float] | None = None
    """CPU, GPU, memory (bytes), accelerator_type:<type>..."""


class _NodeList(BaseModel):
    result: list[RayNode]


class _NodeListResult(BaseModel):
    result: _NodeList


class _NodesAnswer(BaseModel):
    """The State API's envelope: `{"data": {"result": {"result": [node, ...]}}}`."""

    data: _NodeListResult


class NodeSummary(TypedDict):
    """One Ray node in a few fields (providers.node.node_summary); broker.payloads.NodeJoined's fields."""

    node_id: str | None
    node_ip: str | None
    head: bool
    cpus: float
    gpus: float
    memory_gb: float
    accelerator: str | None


def cluster_nodes(endpoint: NodeEndpoint) -> list[RayNode]:
    """The Ray nodes of the head's cluster, as its State API lists them (`ray list nodes`): node_id, node_ip,
    is_head_node, state (ALIVE, DEAD), resources_total..."""
    body = _get_json(endpoint, "/api/v0/nodes")
    try:
        return _NodesAnswer.model_validate(body).data.result.result
    except ValidationError:
        raise NodeError("the node's Ray head answered /api/v0/nodes without a node list") from None


def cluster_status(endpoint: NodeEndpoint) -> str:
    """What `ray status` prints for the head's cluster (nodes, resources in use, pending demands)."""
    body = _get_json(endpoint, "/api/cluster_status?format=1")
    try:
        return str(body["data"]["clusterStatus"])
    except (KeyError, TypeError):
        raise NodeError("the node's Ray head answered /api/cluster_status without a status") from None


def node_summary(node: RayNode) -> NodeSummary:
    """One Ray node in a few fields: its id and address, whether it is the head, CPUs, GPUs, memory and the
    accelerator type Ray detected (the `accelerator_type:<type>` resource a job may ask for)."""
    total = node.resources_total or {}
    accelerators = [k.split(":", 1)[1] for k in total if k.startswith("accelerator_type:")]
    return {
        "node_id": node.node_id,
        "node_ip": node.node_ip,
        "head": bool(node.is_head_node),
        "cpus": total.get("CPU", 0),
        "gpus": total.get("GPU", 0),
        "memory_gb": round(total.get("memory", 0) / 2**30, 1),
        "accelerator": accelerators[0] if accelerators else None,
    }


class RuntimeEnv(TypedDict, total=False):
    """What a job takes along to the node (Ray's runtime_env): the trainer package, env vars, and files."""

    py_modules: list[str]
    env_vars: dict[str, str]
    working_dir: str


@dataclass(frozen=True)
class NodeTimeouts:
    """How long a call to a node's Jobs API waits: for the connection, for an answer, and for the answer to
    an upload of a job's files (each wait on the socket; a large upload gets a longer one)."""

    connect_s: float = API_CONNECT_TIMEOUT_S
    read_s: float = NODE_API_TIMEOUT_S
    upload_s: float = UPLOAD_TIMEOUT_S

    @classmethod
    def of(cls, settings: Settings) -> NodeTimeouts:
        return cls(settings.api_connect_timeout_s, settings.node_api_timeout_s, settings.upload_timeout_s)

    def for_request(self, method: str, path: str) -> tuple[float, float]:
        """requests' (connect, read) timeout for one request of Ray's client."""
        upload = method == "PUT" and path.startswith("/api/packages/")
        return self.connect_s, self.upload_s if upload else self.read_s


class NodeClient:
    """Submit, watch and stop Ray jobs on one node. Submissions are idempotent by submission id."""

    def __init__(self, endpoint: NodeEndpoint, timeouts: NodeTimeouts | None = None) -> None:
        session = channel(endpoint)
        try:
            self._client = _submission_client(endpoint, session, timeouts or NodeTimeouts())
        except (OSError, RuntimeError) as exc:
            session.close()
            raise NodeError(f"the node's Ray head at {endpoint.jobs_url} does not answer: {exc}") from None

    def info(self, submission_id: str) -> JobInfo | None:
        """The job's status, or None when the node has no such job."""
        try:
            info = self._client.get_job_info(submission_id)
        except RuntimeError as exc:
            if "does not exist" in str(exc) or "404" in str(exc):
                return None
            raise NodeError(f"cannot read job {submission_id}: {exc}") from None
        except OSError as exc:  # requests' errors are OSErrors: the node does not answer (gone?)
            raise NodeError(f"cannot read job {submission_id}: {exc}") from None
        start, end = info.start_time, info.end_time  # milliseconds
        seconds = round((end - start) / 1000, 3) if start is not None and end is not None else None
        never_ran = str(getattr(info, "error_type", None) or "") in NEVER_RAN_ERRORS
        return JobInfo(
            JobStatus(str(info.status)), info.message or "", info.driver_exit_code, seconds, never_ran
        )

    def submit(
        self, submission_id: str, entrypoint: str, env: dict[str, str], files: Path | None = None
    ) -> None:
        """Start the job unless the node already has one with this id. `files` (a directory) travels with
        it and is the job's current directory on the node (Ray uploads it once per content hash)."""
        if self.info(submission_id) is not None:
            return
        runtime_env: RuntimeEnv = {
            "py_modules": [str(TRAINER_DIR)],
            "env_vars": {"RAY_DEDUP_LOGS": "0", "PYTHONUNBUFFERED": "1", **env},
        }
        if files is not None:
            runtime_env["working_dir"] = str(files)
        try:
            self._client.submit_job(
                entrypoint=entrypoint, submission_id=submission_id, runtime_env=runtime_env
            )
        except RuntimeError as exc:
            if "already exists" in str(exc):
                return
            raise NodeError(f"cannot submit job {submission_id}: {exc}") from None
        except OSError as exc:
            raise NodeError(f"cannot submit job {submission_id}: {exc}") from None

    def delete(self, submission_id: str) -> None:
        """Forget an ended job on the node (its id can be submitted again); a job it does not know is gone."""
        try:
            self._client.delete_job(submission_id)
        except RuntimeError as exc:
            if "does not exist" not in str(exc) and "404" not in str(exc):
                raise NodeError(f"cannot delete job {submission_id}: {exc}") from None
        except OSError as exc:
            raise NodeError(f"cannot delete job {submission_id}: {exc}") from None

    def logs(self, submission_id: str) -> str:
        try:
            return str(self._client.get_job_logs(submission_id))
        except (RuntimeError, OSError) as exc:
            raise NodeError(f"cannot read the logs of job {submission_id}: {exc}") from None

    def stop(self, submission_id: str) -> bool:
        try:
            return bool(self._client.stop_job(submission_id))
        except (RuntimeError, OSError):
            return False


def _submission_client(endpoint: NodeEndpoint, session: requests.Session, timeouts: NodeTimeouts) -> Any:
    """Ray's JobSubmissionClient whose every request (the jobs, their logs, the working_dir's upload) goes
    through `session`, the node's checked channel, instead of a bare `requests.request`, with `timeouts`
    (Ray's own sends none)."""
    from ray._private.authentication.http_token_authentication import format_authentication_http_error
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    class ChannelClient(JobSubmissionClient):  # type: ignore[misc]
        def _do_request(
            self,
            method: str,
            endpoint: str,
            *,
            data: bytes | None = None,
            json_data: dict[str, Any] | None = None,
            **kwargs: Any,
        ) -> requests.Response:
            kwargs.setdefault("timeout", timeouts.for_request(method, endpoint))
            reply = session.request(
                method,
                self._address + endpoint,
                cookies=self._cookies,
                data=data,
                json=json_data,
                headers=self._headers,
                **kwargs,
            )
            formatted = format_authentication_http_error(reply.status_code, reply.text)
            if formatted:
                raise AuthenticationError(formatted)
            return reply

    return ChannelClient(endpoint.jobs_url, headers=fleet_headers(endpoint))
