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
{CPU: 1} run on `num_cpus: 2`, 3 wait forever). Custom resources (`accelerator_type:...`, `memory`) are
not checked here.

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
from jobs.sections import LocalSection, ProviderName, ProviderSection
from trainer.config import AnyTrainConfig, AxolotlConfig

if TYPE_CHECKING:
    from jobs.spec import JobSpec

_EPS = 1e-9  # fractional amounts ({GPU: 0.5}) are floats; 2 x 0.5 must fit in 1
CHECKED = ("GPU", "CPU")  # the resources whose amount per node the job file says


@dataclass(frozen=True)
class NodeShape:
    """What each of the job's `nodes` machines offers Ray, and the job-file keys that say so."""

    provider: ProviderName
    gpus: int
    cpus: int
    nodes: int
    cpus_written: bool
    """False for a local node without `num_cpus`: it gets this machine's CPUs."""

    def key(self, resource: str) -> str:
        """The job-file key that says how much of `resource` a node has."""
        local = self.provider is ProviderName.LOCAL
        if resource == "GPU":
            return f"{self.provider.value}.{'num_gpus' if local else 'gpu_count'}"
        return f"{self.provider.value}.{'num_cpus' if local else 'min_vcpu_count'}"

    def amount(self, resource: str) -> int:
        return self.gpus if resource == "GPU" else self.cpus

    def said(self, resource: str) -> str:
        """`runpod.gpu_count: 1 x num_nodes: 1`: the keys and values that give the nodes' `resource`."""
        value = f"{self.amount(resource)}"
        if resource == "CPU" and not self.cpus_written:
            value = f"(unset: this machine's {self.cpus})"
        return f"{self.key(resource)}: {value} x num_nodes: {self.nodes}"


def node_shape(provider: ProviderName, section: ProviderSection) -> NodeShape:
    """What each node of `section` offers Ray (see the module docstring)."""
    if isinstance(section, LocalSection):
        cpus = section.num_cpus or os.cpu_count() or 1
        return NodeShape(provider, section.num_gpus, cpus, section.num_nodes, section.num_cpus is not None)
    return NodeShape(provider, section.gpu_count, section.min_vcpu_count, section.num_nodes, True)


def worker_bundle(train: AnyTrainConfig, gpus: int) -> dict[str, float]:
    """The resources Ray reserves for each worker on a node with `gpus` GPUs, as Ray Train works them out
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


def with_default_workers(
    train: AnyTrainConfig, provider: ProviderName, section: ProviderSection
) -> AnyTrainConfig:
    """`train` with `ray_num_workers` set, when the job uses Ray and leaves it unset, to as many workers as
    the nodes' GPUs hold (one per GPU by default); 1 without GPUs. What the node gets (the TrainJob is
    built from the spec)."""
    if not train.use_ray or "ray_num_workers" in train.model_fields_set:
        return train
    shape = node_shape(provider, section)
    workers = 1
    if shape.gpus > 0:
        fits = per_node(worker_bundle(train, shape.gpus), shape, "GPU")
        workers = max(1, int(min(fits, shape.gpus)) * shape.nodes)
    return train.model_copy(update={"ray_num_workers": workers})


def topology_problems(spec: JobSpec, lines: Mapping[str, int]) -> list[Problem]:
    """The job's shape against its nodes: GPUs and nodes without Ray, Ray's workers that cannot all be
    placed (each with the numbers and the key to change)."""
    shape = node_shape(spec.provider, spec.section)
    return [*_without_ray(spec.train, shape, lines), *_ray_fit(spec.train, shape, lines)]


def _without_ray(train: AnyTrainConfig, shape: NodeShape, lines: Mapping[str, int]) -> list[Problem]:
    if train.use_ray:
        return []
    problems = []
    if shape.gpus > 1 and not isinstance(train, AxolotlConfig):
        where = shape.key("GPU")
        message = (
            f"{shape.gpus} without use_ray trains on one GPU; set use_ray: true (one Ray worker per GPU), "
            f"or {where.split('.')[-1]}: 1"
        )
        problems.append(Problem(where, message, line_of(lines, where)))
    if shape.nodes > 1:
        where = f"{shape.provider.value}.num_nodes"
        message = (
            f"{shape.nodes} without use_ray trains on the first node only; set use_ray: true (Ray Train "
            "places its workers on every node), or num_nodes: 1"
        )
        problems.append(Problem(where, message, line_of(lines, where)))
    return problems


def _ray_fit(train: AnyTrainConfig, shape: NodeShape, lines: Mapping[str, int]) -> list[Problem]:
    if not train.use_ray or (isinstance(train, AxolotlConfig) and shape.gpus == 0):
        return []  # (axolotl's Ray on a node without GPUs: jobs.node_fit says why, once)
    bundle = worker_bundle(train, shape.gpus)
    workers = train.ray_num_workers
    said = []
    for resource in CHECKED:
        need = bundle.get(resource, 0.0)
        if need <= 0:
            continue
        fit = per_node(bundle, shape, resource)
        if fit == 0:
            key, has = shape.key(resource), shape.amount(resource)
            said.append(
                f"a worker's {_shown(bundle)} is placed whole on one node, and {key}: {has} gives a node "
                f"{_count(has, resource)}; ask fewer per worker (resources_per_worker), or raise {key}"
            )
        elif fit * shape.nodes < workers:
            said.append(_short(workers, bundle, shape, resource, int(fit)))
    if not said:
        return []
    where = next((k for k in ("ray_num_workers", "resources_per_worker") if k in lines), "ray_num_workers")
    return [Problem(where, "; and ".join(said), line_of(lines, where))]


def _short(workers: int, bundle: Mapping[str, float], shape: NodeShape, resource: str, fit: int) -> str:
    """`2 workers x {GPU: 1} need 2 GPUs; runpod.gpu_count: 1 x num_nodes: 1 has 1`, and the way out."""
    need = workers * bundle[resource]
    total = shape.amount(resource) * shape.nodes
    noun, verb = ("worker", "needs") if workers == 1 else ("workers", "need")
    text = f"{workers} {noun} x {_shown(bundle)} {verb} {_count(need, resource)}; "
    text += f"{shape.said(resource)} has {total:g}"
    if need <= total + _EPS:  # enough in all, but a worker never spans two nodes
        text += f", but whole workers fit {fit} per node ({fit * shape.nodes} in all)"
    if resource == "GPU":
        return text + f"; lower ray_num_workers to {fit * shape.nodes} or raise {shape.key('GPU')}"
    return text + f"; raise {shape.key('CPU')}, or ask fewer CPUs per worker (resources_per_worker)"


def _count(amount: float, resource: str) -> str:
    return f"{amount:g} {resource}{'' if amount == 1 else 's'}"


def _shown(bundle: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{name}: {amount:g}" for name, amount in bundle.items()) + "}"
