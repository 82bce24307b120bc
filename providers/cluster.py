"""A node's Ray cluster as its head's State API shows it (`ray list nodes`, `ray status`), read over the
node's channel (providers.node.channel) with the fleet's headers."""

from __future__ import annotations

from typing import Any, TypedDict

import requests
from pydantic import BaseModel, ConfigDict, ValidationError

from core.errors import NodeError
from providers.base import NodeEndpoint
from providers.node import channel, fleet_headers


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
    """One Ray node in a few fields (providers.cluster.node_summary); state.payloads.NodeJoined's fields."""

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
