"""Whether the job's shape fits its nodes: Ray Train's workers against the GPUs and CPUs of `num_nodes`
machines, and what more than one GPU or node does without Ray. Checked at validate and again at submit
(jobs.node_fit), before anything is rented.

What a node offers Ray: a rented node's head runs `ray start` without `--num-gpus`/`--num-cpus`, so Ray
advertises the machine's GPUs (`gpu_count`: the offer filter takes only offers with exactly that many) and
vCPUs (at least `min_vcpu_count`: the offer filter's floor, so that is what the check counts on); a local
node gets `num_gpus` and `num_cpus` (unset: this machine's CPUs, as providers.local starts it).

What the workers ask: each worker is one Ray bundle, placed whole on one node: `resources_per_worker`
with its zero amounts dropped, else {GPU: 1} on a GPU node and {CPU: 1} without GPUs, and GPU: 1 added
whenever the workers use GPUs (Ray Train's ScalingConfig; axolotl's launcher always uses GPUs). Ray
Train's controller and the Ray job's driver take no CPU (checked with a real Ray 2.60: 2 workers x
{CPU: 1} run on `num_cpus: 2`, 3 wait forever). Of the custom resources, `accelerator_type:<GPU>` is
checked as a placement: Ray gives it to a node with that GPU (RunPod's GPU ids are the driver's names, so
the type is known before renting; vast.ai's and a local node's are not), and a worker asking it goes only
there. Others (`memory`, a node's own) are not checked here; the trainer's placement check sees them.

A cluster whose head has its own shape (`head:`) is two shapes: the head, and `num_nodes - 1` nodes of the
section's. When their GPU types differ, the workers must be pinned to one (`accelerator_type:`): data-
parallel workers wait at every step for the slowest GPU, so the fleet does not guess.

Without `use_ray` the builtin recipe trains in one process on one GPU, so more GPUs than one is an error
(the fix in its message); axolotl without Ray launches with accelerate, which starts one process per GPU
of the node, so one node with many GPUs is fine for it. Neither spreads over several nodes without Ray.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.errors import Problem
from jobs.problems import line_of
from jobs.sections import LocalSection, ProviderName, SectionBase
from jobs.sections.base import MachineSection, RemoteSection
from trainer.config import AnyTrainConfig, AxolotlConfig

if TYPE_CHECKING:
    from jobs.spec import JobSpec

_EPS = 1e-9  # fractional amounts ({GPU: 0.5}) are floats; 2 x 0.5 must fit in 1
CHECKED = ("GPU", "CPU")  # the resources whose amount per node the job file says
PIN = "accelerator_type:"  # the custom resource Ray gives a node with a GPU of that type


@dataclass(frozen=True)
class NodeShape:
    """`nodes` machines of one shape in the job's cluster, what each offers Ray, and the job-file keys that
    say so. A cluster is one shape, or two when the head has its own (`head:`, listed first)."""

    provider: ProviderName
    gpus: int
    cpus: int | None
    """None: not known before the machine is claimed (a pool machine's), so not checked here."""
    nodes: int
    cpus_written: bool
    """False for a local node without `num_cpus`: it gets this machine's CPUs."""
    gpu: str | None = None
    """The GPU type as the job names it, with `accelerator`, what Ray calls it: None when the provider's
    names are not the driver's (vast.ai) or the node's GPUs are not known (local)."""
    accelerator: str | None = None
    head: bool = False
    """The head's own shape (`<provider>.head`), one node."""
    beside_head: bool = False
    """The section's shape in a cluster whose head has its own: `num_nodes - 1` nodes."""

    @property
    def section(self) -> str:
        """Where the shape's keys are in the job file: `runpod`, or `runpod.head`."""
        return f"{self.provider.value}.head" if self.head else self.provider.value

    def key(self, resource: str) -> str:
        """The job-file key that says how much of `resource` a node has."""
        local = self.provider == ProviderName.LOCAL
        if resource == "GPU":
            return f"{self.section}.{'num_gpus' if local else 'gpu_count'}"
        return f"{self.section}.{'num_cpus' if local else 'min_vcpu_count'}"

    def amount(self, resource: str) -> int:
        return self.gpus if resource == "GPU" else self.cpus or 0

    def said(self, resource: str) -> str:
        """`runpod.gpu_count: 1 x num_nodes: 1`: the keys and values that give the nodes' `resource` (in a
        cluster with its own head: `... (the head)`, `... x 2 other nodes`)."""
        value = f"{self.amount(resource)}"
        if resource == "CPU" and not self.cpus_written:
            value = f"(unset: this machine's {self.cpus})"
        if self.head:
            return f"{self.key(resource)}: {value} (the head)"
        if not self.beside_head:
            return f"{self.key(resource)}: {value} x num_nodes: {self.nodes}"
        return f"{self.key(resource)}: {value} x {self.nodes} other node{'s' if self.nodes != 1 else ''}"

    def holds(self, bundle: Mapping[str, float]) -> bool:
        """Whether a worker pinned to a GPU type (`accelerator_type:<type>` in its bundle) may be placed
        here: the node has that type, or its type is not known before it runs."""
        pins = {key.removeprefix(PIN) for key in bundle if key.startswith(PIN)}
        if not pins:
            return True
        if self.gpus == 0:
            return False  # Ray gives the pin's resource only to a node with such a GPU
        return self.accelerator is None or pins == {self.accelerator}

    def named(self) -> str:
        """`runpod.gpu: NVIDIA L40S (L40S to Ray)`, or how many GPUs it has when their type is not known."""
        if self.gpu is None or self.gpus == 0:
            return f"{self.key('GPU')}: {self.gpus}"
        return f"{self.section}.gpu: {self.gpu} ({self.accelerator} to Ray)"


def cluster_shape(provider: ProviderName, section: SectionBase) -> tuple[NodeShape, ...]:
    """What the nodes of `section` offer Ray (see the module docstring): one shape, or the head's own first
    and then the other nodes'."""
    if isinstance(section, LocalSection):
        cpus = section.num_cpus or os.cpu_count() or 1
        return (NodeShape(provider, section.num_gpus, cpus, section.num_nodes, section.num_cpus is not None),)
    shapes = []
    if section.has_own_head:
        shapes.append(_rented(provider, section.node_section(0), 1, head=True))
    shapes.append(_rented(provider, section, section.num_nodes - len(shapes), beside_head=bool(shapes)))
    return tuple(shapes)


def _rented(
    provider: ProviderName,
    section: SectionBase,
    nodes: int,
    head: bool = False,
    beside_head: bool = False,
) -> NodeShape:
    assert isinstance(section, MachineSection)
    gpu, accelerator = section.ray_gpu() or (None, None)
    cpus = section.min_vcpu_count if isinstance(section, RemoteSection) else None
    return NodeShape(provider, section.gpu_count, cpus, nodes, True, gpu, accelerator, head, beside_head)


def worker_bundle(train: AnyTrainConfig, gpus: int) -> dict[str, float]:
    """The resources Ray reserves for each worker on a cluster with `gpus` GPUs, as Ray Train works them out
    from what the trainer passes (trainer.train for the builtin recipe, axolotl's own launcher)."""
    use_gpu = isinstance(train, AxolotlConfig) or gpus > 0
    given = train.resources_per_worker
    if not given:
        bundle = {"GPU": 1.0} if use_gpu else {"CPU": 1.0}
    else:
        bundle = {name: amount for name, amount in given.items() if amount != 0}
    if use_gpu:
        bundle.setdefault("GPU", 1.0)
    return bundle


def per_node(bundle: Mapping[str, float], shape: NodeShape, resource: str) -> float:
    """How many whole workers one node holds by `resource` alone (inf when a worker asks none of it)."""
    need = bundle.get(resource, 0.0)
    return math.floor(shape.amount(resource) / need + _EPS) if need > 0 else math.inf


def _gpus(cluster: tuple[NodeShape, ...]) -> int:
    return sum(shape.gpus for shape in cluster)


def with_default_workers(
    train: AnyTrainConfig, provider: ProviderName, section: SectionBase
) -> AnyTrainConfig:
    """`train` with `ray_num_workers` set, when the job uses Ray and leaves it unset, to as many workers as
    the GPUs of the nodes that may hold them hold (one per GPU by default; a pinned GPU type counts only
    its nodes); 1 without GPUs. What the node gets (the TrainJob is built from the spec)."""
    if not train.use_ray or "ray_num_workers" in train.model_fields_set:
        return train
    cluster = cluster_shape(provider, section)
    bundle = worker_bundle(train, _gpus(cluster))
    workers = 0
    for shape in cluster:
        if shape.gpus > 0 and shape.holds(bundle):
            workers += int(min(per_node(bundle, shape, "GPU"), shape.gpus)) * shape.nodes
    return train.model_copy(update={"ray_num_workers": max(1, workers)})


def topology_problems(spec: JobSpec, lines: Mapping[str, int]) -> list[Problem]:
    """The job's shape against its nodes: GPUs and nodes without Ray, Ray's workers that cannot all be
    placed (each with the numbers and the key to change)."""
    cluster = cluster_shape(spec.provider, spec.section)
    return [*_without_ray(spec.train, cluster, lines), *_ray_fit(spec.train, cluster, lines)]


def _without_ray(
    train: AnyTrainConfig, cluster: tuple[NodeShape, ...], lines: Mapping[str, int]
) -> list[Problem]:
    if train.use_ray:
        return []
    problems = []
    shape = cluster[0]  # without Ray the job runs on the head alone
    if shape.gpus > 1 and not isinstance(train, AxolotlConfig):
        where = shape.key("GPU")
        message = (
            f"{shape.gpus} without use_ray trains on one GPU; set use_ray: true (one Ray worker per GPU), "
            f"or {where.split('.')[-1]}: 1"
        )
        problems.append(Problem(where, message, line_of(lines, where)))
    nodes = sum(s.nodes for s in cluster)
    if nodes > 1:
        where = f"{shape.provider.value}.num_nodes"
        message = (
            f"{nodes} without use_ray trains on the first node only; set use_ray: true (Ray Train "
            "places its workers on every node), or num_nodes: 1"
        )
        problems.append(Problem(where, message, line_of(lines, where)))
    return problems


def _ray_fit(
    train: AnyTrainConfig, cluster: tuple[NodeShape, ...], lines: Mapping[str, int]
) -> list[Problem]:
    if not train.use_ray or (isinstance(train, AxolotlConfig) and _gpus(cluster) == 0):
        return []  # (axolotl's Ray on a node without GPUs: jobs.node_fit says why, once)
    bundle = worker_bundle(train, _gpus(cluster))
    where = next(
        (k for k in ("resources_per_worker", "ray_num_workers") if k in lines), "resources_per_worker"
    )
    placed = [shape for shape in cluster if shape.holds(bundle)]
    if not placed:
        return [Problem(where, _no_such_gpu(bundle, cluster), line_of(lines, where))]
    mixed = _mixed(bundle, placed)
    if mixed is not None:
        return [Problem(where, mixed, line_of(lines, where))]
    workers = train.ray_num_workers
    said = []
    for resource in CHECKED:
        if bundle.get(resource, 0.0) <= 0 or (resource == "CPU" and any(s.cpus is None for s in placed)):
            continue
        fits = [int(per_node(bundle, shape, resource)) for shape in placed]
        if not any(fits):
            big = max(placed, key=lambda shape: shape.amount(resource))
            key, has = big.key(resource), big.amount(resource)
            said.append(
                f"a worker's {_shown(bundle)} is placed whole on one node, and {key}: {has} gives a node "
                f"{_count(has, resource)}; ask fewer per worker (resources_per_worker), or raise {key}"
            )
        elif sum(fit * shape.nodes for fit, shape in zip(fits, placed, strict=True)) < workers:
            said.append(_short(workers, bundle, tuple(placed), resource, fits))
    if not said:
        return []
    where = next((k for k in ("ray_num_workers", "resources_per_worker") if k in lines), "ray_num_workers")
    return [Problem(where, "; and ".join(dict.fromkeys(said)), line_of(lines, where))]


def _no_such_gpu(bundle: Mapping[str, float], cluster: tuple[NodeShape, ...]) -> str:
    """A worker pinned to a GPU type no node of the job has: Ray would wait for such a node forever."""
    pins = ", ".join(sorted(key for key in bundle if key.startswith(PIN)))
    nodes = "; ".join(shape.named() for shape in cluster)
    return (
        f"{pins} places the workers only on nodes with that GPU, and this job's nodes have none ({nodes}); "
        "pin the GPU Ray names on a node of the job, or rent that GPU"
    )


def _mixed(bundle: Mapping[str, float], placed: list[NodeShape]) -> str | None:
    """Workers not pinned to a GPU type on a cluster whose nodes have different ones: data-parallel
    workers wait at every step for the slowest, so the job must say where they train."""
    if "GPU" not in bundle or any(key.startswith(PIN) for key in bundle):
        return None
    types = {shape.accelerator for shape in placed if shape.gpus > 0 and per_node(bundle, shape, "GPU")}
    if len(types) < 2 or None in types:
        return None
    nodes = ", ".join(shape.named() for shape in placed)
    main = placed[-1].accelerator
    return (
        f"the cluster's GPUs differ ({nodes}) and resources_per_worker does not say which the workers train "
        "on; data-parallel workers wait at every step for the slowest GPU. Pin them to one type, as Ray's "
        f"docs do (resources_per_worker: {{{PIN}{main}: 0.001}}), or give the head the same gpu"
    )


def _short(
    workers: int,
    bundle: Mapping[str, float],
    placed: tuple[NodeShape, ...],
    resource: str,
    fits: list[int],
) -> str:
    """`2 workers x {GPU: 1} need 2 GPUs; runpod.gpu_count: 1 x num_nodes: 1 has 1`, and the way out."""
    need = workers * bundle[resource]
    total = sum(shape.amount(resource) * shape.nodes for shape in placed)
    whole = sum(fit * shape.nodes for fit, shape in zip(fits, placed, strict=True))
    noun, verb = ("worker", "needs") if workers == 1 else ("workers", "need")
    text = f"{workers} {noun} x {_shown(bundle)} {verb} {_count(need, resource)}; "
    text += " + ".join(shape.said(resource) for shape in placed)
    text += f" {'has' if len(placed) == 1 else 'have'} {total:g}"
    if need <= total + _EPS:  # enough in all, but a worker never spans two nodes
        if len(placed) == 1:
            text += f", but whole workers fit {fits[0]} per node ({whole} in all)"
        else:
            text += f", but whole workers fit {whole} in all"
    key = placed[-1].key(resource)
    if resource == "GPU":
        return text + f"; lower ray_num_workers to {whole} or raise {key}"
    return text + f"; raise {key}, or ask fewer CPUs per worker (resources_per_worker)"


def _count(amount: float, resource: str) -> str:
    return f"{amount:g} {resource}{'' if amount == 1 else 's'}"


def _shown(bundle: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{name}: {amount:g}" for name, amount in bundle.items()) + "}"
