"""Talking to a node's Ray head through the Ray Jobs API (token in headers, never logged).

Every call names the fleet in its User-Agent, which the node's failsafe (providers.onnode.failsafe) counts as
the fleet's heartbeat: a node that hears none for `node_heartbeat_timeout_s` gives itself back.

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
from requests.adapters import HTTPAdapter

from core.errors import NodeError, Unreachable
from core.settings import API_CONNECT_TIMEOUT_S, NODE_API_TIMEOUT_S, UPLOAD_TIMEOUT_S, Settings
from providers.base import NodeEndpoint, Unanswered
from providers.onnode import failsafe
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
    """Submit, watch and stop Ray jobs on one node. Submissions are idempotent by submission id.

    Only a submission goes through Ray's own JobSubmissionClient (it packs and uploads the job's files as the
    node's Ray expects them); reading a job, its logs, stopping and deleting it are the Jobs API's plain
    REST calls on the same channel. Importing Ray's client takes a worker seconds of CPU, which a watcher
    that only reads jobs never pays (and a `fleet run` paid on its first look at a job)."""

    def __init__(self, endpoint: NodeEndpoint, timeouts: NodeTimeouts | None = None) -> None:
        self._endpoint, self._timeouts = endpoint, timeouts or NodeTimeouts()
        self._session = channel(endpoint)
        self._headers = fleet_headers(endpoint)
        self._client: Any = None  # Ray's, made for the first submission
        try:
            reply = self._request("GET", "/api/version")
        except NodeError as exc:
            self._session.close()
            raise NodeError(f"the node's Ray head at {endpoint.jobs_url} does not answer: {exc}") from None
        if reply.status_code != 200:
            self._session.close()
            raise NodeError(
                f"the node's Ray head at {endpoint.jobs_url} does not answer: /api/version is HTTP "
                f"{reply.status_code}"
            )

    def _request(self, method: str, path: str) -> requests.Response:
        """One Jobs API call on the node's channel; NodeError when it gets no answer or the node refuses the
        fleet's token."""
        try:
            reply = self._session.request(
                method,
                self._endpoint.jobs_url + path,
                headers=self._headers,
                timeout=self._timeouts.for_request(method, path),
            )
        except OSError as exc:  # requests' errors are OSErrors: the node does not answer (gone?)
            raise NodeError(str(exc)) from None
        if reply.status_code in (401, 403):
            refused = f"the node refused the fleet's Ray token (HTTP {reply.status_code})"
            raise NodeError(f"{refused}: {reply.text[:500]}")
        return reply

    def _json(self, method: str, path: str, what: str) -> Any:
        """The JSON answer of a call; None when the node has no such job (HTTP 404)."""
        try:
            reply = self._request(method, path)
        except NodeError as exc:
            raise NodeError(f"cannot {what}: {exc}") from None
        if reply.status_code == 404:
            return None
        if reply.status_code != 200:
            raise NodeError(f"cannot {what}: HTTP {reply.status_code}: {reply.text[:500]}")
        try:
            return reply.json()
        except ValueError:
            raise NodeError(f"cannot {what}: not JSON: {reply.text[:200]}") from None

    def info(self, submission_id: str) -> JobInfo | None:
        """The job's status, or None when the node has no such job."""
        found = self._json("GET", f"/api/jobs/{submission_id}", f"read job {submission_id}")
        if found is None:
            return None
        start, end = found.get("start_time"), found.get("end_time")  # milliseconds
        seconds = round((end - start) / 1000, 3) if start is not None and end is not None else None
        never_ran = str(found.get("error_type") or "") in NEVER_RAN_ERRORS
        return JobInfo(
            JobStatus(str(found["status"])),
            found.get("message") or "",
            found.get("driver_exit_code"),
            seconds,
            never_ran,
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
            self._ray().submit_job(
                entrypoint=entrypoint, submission_id=submission_id, runtime_env=runtime_env
            )
        except RuntimeError as exc:
            if "already exists" in str(exc):
                return
            raise NodeError(f"cannot submit job {submission_id}: {exc}") from None
        except OSError as exc:
            raise NodeError(f"cannot submit job {submission_id}: {exc}") from None

    def _ray(self) -> Any:
        """Ray's JobSubmissionClient on this node's channel, made at the first call."""
        if self._client is None:
            self._client = _submission_client(self._endpoint, self._session, self._timeouts)
        return self._client

    def delete(self, submission_id: str) -> None:
        """Forget an ended job on the node (its id can be submitted again); a job it does not know is gone."""
        self._json("DELETE", f"/api/jobs/{submission_id}", f"delete job {submission_id}")

    def logs(self, submission_id: str) -> str:
        found = self._json("GET", f"/api/jobs/{submission_id}/logs", f"read the logs of job {submission_id}")
        if found is None:
            raise NodeError(f"cannot read the logs of job {submission_id}: the node has no such job")
        return str(found.get("logs", ""))

    def stop(self, submission_id: str) -> bool:
        try:
            found = self._json("POST", f"/api/jobs/{submission_id}/stop", f"stop job {submission_id}")
        except NodeError:
            return False
        return bool(found and found.get("stopped"))


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
