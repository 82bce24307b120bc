"""Talking to a node's Ray head through the Ray Jobs API (token in headers, never logged).

Every call names the fleet in its User-Agent, which the node's failsafe (providers.failsafe) counts as the
fleet's heartbeat: a node that hears none for `node_heartbeat_timeout_s` gives itself back.
"""

from __future__ import annotations

import functools
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from enum import StrEnum
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypedDict

from pydantic import BaseModel, ConfigDict, ValidationError

from core.errors import NodeError
from providers import failsafe
from providers.base import NodeEndpoint

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


def jobs_api_answers(url: str, headers: dict[str, str], timeout_s: float = 2.0) -> bool:
    """Whether a Ray head's Jobs API at `url` answers with the node's token (HTTP 200 on /api/version)."""
    request = urllib.request.Request(f"{url.rstrip('/')}/api/version", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@functools.cache
def user_agent() -> str:
    """`trainfleet/<version> heartbeat`: how the fleet names itself to a node."""
    return failsafe.USER_AGENT.format(version=version("trainfleet"))


def fleet_headers(endpoint: NodeEndpoint) -> dict[str, str]:
    """The node's token headers, and the fleet's User-Agent (a heartbeat to the node's failsafe)."""
    return {**endpoint.headers, "User-Agent": user_agent()}


def ping(endpoint: NodeEndpoint, timeout_s: float = 5.0) -> bool:
    """A heartbeat to the node's failsafe (GET /api/version with the node's token); whether the head
    answered. Never raises: an unreachable node is the caller's to judge."""
    return jobs_api_answers(endpoint.jobs_url, fleet_headers(endpoint), timeout_s)


def _get_json(endpoint: NodeEndpoint, path: str, timeout_s: float = 10.0) -> Any:
    request = urllib.request.Request(
        f"{endpoint.jobs_url.rstrip('/')}{path}", headers=fleet_headers(endpoint)
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return json.loads(reply.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
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


class NodeClient:
    """Submit, watch and stop Ray jobs on one node. Submissions are idempotent by submission id."""

    def __init__(self, endpoint: NodeEndpoint) -> None:
        from ray.job_submission import JobSubmissionClient

        try:
            self._client = JobSubmissionClient(endpoint.jobs_url, headers=fleet_headers(endpoint))
        except (OSError, RuntimeError) as exc:
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
        return JobInfo(JobStatus(str(info.status)), info.message or "", info.driver_exit_code, seconds)

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
