"""Whether the Ray cluster can place the job's Ray Train workers, waited for before `TorchTrainer.fit()`.

Ray Train asks for one placement group of `ray_num_workers` identical bundles (`resources_per_worker`,
GPU: 1 added when the job uses GPUs; its controller and sync actor take no resources, Ray 2.60) and, when
the cluster cannot hold them, waits without end and without a word. So the driver looks first: each bundle
must fit on one node, and the alive nodes' free resources are packed with them. While they do not fit it
prints a PENDING progress line (the demand and what each node has) at once and every `report_every_s`,
waits for nodes to join or resources to be freed, and after the fleet's bound (FLEET_TRAIN_PENDING_S) fails
with ResourcesUnavailable naming both.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from trainer import lines
from trainer.errors import ResourcesUnavailable, TrainerError
from trainer.progress import PENDING_ENV

DEFAULT_LIMIT_S = 600.0  # a node started by hand (no fleet) waits this long
SHOWN = ("CPU", "GPU")  # besides the demand's own keys, what a node's line always shows
_EPS = 1e-6  # Ray keeps resources as fixed point (1e-4); float sums must not lose a whole bundle


@dataclass(frozen=True)
class Demand:
    """What Ray Train asks of the cluster: `workers` bundles of `per_worker`, each on one node."""

    workers: int
    per_worker: Mapping[str, float]

    @classmethod
    def of(cls, workers: int, resources: Mapping[str, float], use_gpu: bool) -> Demand:
        """The bundle as Ray Train builds it (ray.air.config.ScalingConfig._resources_per_worker_not_none):
        zero amounts dropped, one GPU added when the job uses GPUs and did not say how many."""
        bundle = {key: float(value) for key, value in resources.items() if value != 0}
        if use_gpu:
            bundle.setdefault("GPU", 1.0)
        return cls(workers, bundle)

    def __str__(self) -> str:
        return f"{self.workers} x {resources_text(self.per_worker)}"


@dataclass(frozen=True)
class NodeRoom:
    """One alive Ray node: its resources in all (`total`) and those free now (`available`)."""

    node_id: str
    total: Mapping[str, float]
    available: Mapping[str, float]


@dataclass(frozen=True)
class Placement:
    """How many of the demand's bundles the nodes hold (`per_node`, in the nodes' order), and why not all."""

    demand: Demand
    per_node: tuple[int, ...]
    why: str | None  # None: they all fit

    @property
    def fits(self) -> bool:
        return self.why is None


def bundles_on(room: Mapping[str, float], bundle: Mapping[str, float]) -> int:
    """How many copies of `bundle` fit in `room` (one node's resources)."""
    if not bundle:
        return 1_000_000  # asks for nothing: Ray places it anywhere
    return min(math.floor((room.get(key, 0.0) + _EPS) / need) for key, need in bundle.items())


def place(demand: Demand, nodes: Sequence[NodeRoom]) -> Placement:
    """Pack the demand's bundles onto the nodes' free resources. The bundles are all alike, so filling each
    node in turn places as many as any packing can."""
    per_node = tuple(bundles_on(node.available, demand.per_worker) for node in nodes)
    placed = sum(per_node)
    if placed >= demand.workers:
        return Placement(demand, per_node, None)
    bundle = resources_text(demand.per_worker)
    if not any(bundles_on(node.total, demand.per_worker) for node in nodes):
        missing = sorted(k for k in demand.per_worker if not any(k in node.total for node in nodes))
        lacking = f" (no node has {', '.join(missing)} at all)" if missing else ""
        why = f"no node of the cluster is big enough for one worker's {bundle}{lacking}"
    elif sum(bundles_on(node.total, demand.per_worker) for node in nodes) < demand.workers:
        whole = sum(bundles_on(node.total, demand.per_worker) for node in nodes)
        why = f"the cluster's nodes hold {whole} of the {demand.workers} workers' {bundle} even when idle"
    else:
        why = f"{placed} of the {demand.workers} workers' {bundle} fit in what the nodes have free now"
    return Placement(demand, per_node, why)


def resources_text(resources: Mapping[str, float]) -> str:
    """`{CPU: 2, GPU: 1}`: amounts without a needless `.0`."""
    return "{" + ", ".join(f"{key}: {value:g}" for key, value in resources.items()) + "}"


def relevant(resources: Mapping[str, float], demand: Demand) -> dict[str, float]:
    """The resources a reader needs: CPU, GPU, accelerator types and the demand's keys (not memory, the
    object store or Ray's `node:<ip>` markers)."""
    return {
        k: v
        for k, v in resources.items()
        if k in SHOWN or k in demand.per_worker or k.startswith("accelerator_type:")
    }


def cluster_text(nodes: Sequence[NodeRoom], demand: Demand) -> str:
    """The nodes as the message shows them: each one's free / total of CPU, GPU and the demand's keys."""
    if not nodes:
        return "no alive node"
    parts = []
    for node in nodes:
        keys = [k for k in (*SHOWN, *demand.per_worker) if k in node.total or k in demand.per_worker]
        shown = ", ".join(
            f"{k}: {node.available.get(k, 0):g}/{node.total.get(k, 0):g}" for k in dict.fromkeys(keys)
        )
        parts.append("{" + shown + "}")
    return f"{len(nodes)} node{'s' if len(nodes) != 1 else ''} (free/total): " + ", ".join(parts)


def cluster_nodes() -> list[NodeRoom]:
    """The alive nodes of the Ray cluster this process is connected to, with their free resources."""
    import ray
    from ray._private import state  # Ray 2.60 has no public call for each node's free resources

    free = state.available_resources_per_node()
    return [
        NodeRoom(node["NodeID"], dict(node["Resources"]), dict(free.get(node["NodeID"], {})))
        for node in ray.nodes()
        if node.get("Alive")
    ]


def limit_s(environ: Mapping[str, str]) -> float:
    """The fleet's bound on the wait (FLEET_TRAIN_PENDING_S), or DEFAULT_LIMIT_S without a fleet."""
    text = environ.get(PENDING_ENV)
    if not text:
        return DEFAULT_LIMIT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < math.inf:
        raise TrainerError(f"{PENDING_ENV}={text!r}: expected a number of seconds >= 0")
    return value


def wait_for_room(
    demand: Demand,
    bound_s: float,
    *,
    look: Callable[[], Sequence[NodeRoom]] = cluster_nodes,
    every_s: float = 1.0,
    report_every_s: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once the cluster can place `demand`; meanwhile a PENDING line at once and every
    `report_every_s`. Raises ResourcesUnavailable (after a last PENDING line, `gave_up`) past `bound_s`."""
    start = clock()
    reported: float | None = None
    reports = 0
    while True:
        nodes = list(look())
        placement = place(demand, nodes)
        if placement.fits:
            return
        waited = clock() - start
        if waited >= bound_s:
            lines.emit(pending_line(placement, nodes, waited, bound_s, reports + 1, gave_up=True))
            raise ResourcesUnavailable(
                f"Ray cannot place the training workers: {demand} asked, {placement.why}; the cluster "
                f"has {cluster_text(nodes, demand)}; waited {waited:.0f} s ({PENDING_ENV}={bound_s:g})"
            )
        if reported is None or clock() - reported >= report_every_s:
            reports += 1
            lines.emit(pending_line(placement, nodes, waited, bound_s, reports, gave_up=False))
            reported = clock()
        sleep(max(0.0, min(every_s, bound_s - waited)))


def pending_line(
    placement: Placement,
    nodes: Sequence[NodeRoom],
    waited: float,
    bound_s: float,
    report: int,
    gave_up: bool,
) -> lines.Pending:
    """The PENDING line: the demand, each node's free and total resources, how long so far, the line's
    number in this wait (1: the wait begins)."""
    return lines.Pending(
        workers=placement.demand.workers,
        per_worker=dict(placement.demand.per_worker),
        demand=str(placement.demand),
        nodes=[
            lines.PendingNode(
                node_id=n.node_id,
                total=relevant(n.total, placement.demand),
                available=relevant(n.available, placement.demand),
                fit=fit,
            )
            for n, fit in zip(nodes, placement.per_node, strict=True)
        ],
        cluster=cluster_text(nodes, placement.demand),
        why=placement.why,
        waited_s=round(waited, 1),
        limit_s=bound_s,
        report=report,
        gave_up=gave_up,
    )


def wait_in_ray(workers: int, resources: Mapping[str, float], use_gpu: bool) -> None:
    """`wait_for_room` for the job's Ray Train workers on the connected cluster, bounded by the fleet."""
    wait_for_room(Demand.of(workers, resources, use_gpu), limit_s(os.environ))
