"""jobs.topology: the job's Ray workers against its nodes' GPUs and CPUs, and GPUs or nodes without Ray,
refused at parse time with the numbers, the key and its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigError, Problem
from jobs.spec import JobSpec, parse_job
from jobs.topology import cluster_shape, worker_bundle
from trainer.config import AxolotlConfig

REPO = Path(__file__).resolve().parents[2]
BUILTIN = "base_model: trainfleet/tiny-llama\ndatasets:\n  - path: tatsu-lab/alpaca\nadapter: lora\n"
AXOLOTL = BUILTIN + "trainer: axolotl\n"
RAY = BUILTIN + "use_ray: true\n"  # line 5; the next key is on line 6
CLUSTER = "  num_nodes: 2\n  network_volume_id: vol-abc123\n"


def spec(text: str) -> JobSpec:
    return parse_job(text.encode(), source="job.yml", base_dir=REPO).spec


def workers(text: str) -> int:
    return spec(text).train.ray_num_workers


def refused(text: str) -> Problem:
    with pytest.raises(ConfigError) as info:
        spec(text)
    (problem,) = info.value.problems
    return problem


def test_two_workers_on_one_gpu_are_refused_with_the_numbers() -> None:
    problem = refused(RAY + "ray_num_workers: 2\nrunpod:\n  gpu_count: 1\n")
    assert (problem.path, problem.line) == ("ray_num_workers", 6)
    assert problem.message == (
        "2 workers x {GPU: 1} need 2 GPUs; runpod.gpu_count: 1 x num_nodes: 1 has 1; "
        "lower ray_num_workers to 1 or raise runpod.gpu_count"
    )


def test_workers_over_the_nodes_cpus_are_refused_with_the_numbers() -> None:
    # The fake-pod story: two CPU workers, a node whose Ray has one CPU; Ray would wait forever.
    problem = refused(RAY + "ray_num_workers: 2\nlocal:\n  num_cpus: 1\n")
    assert (problem.path, problem.line) == ("ray_num_workers", 6)
    assert problem.message.startswith(
        "2 workers x {CPU: 1} need 2 CPUs; local.num_cpus: 1 x num_nodes: 1 has 1"
    )
    # On a GPU node a worker's CPUs come with its GPU, against the vCPUs the offer filter guarantees.
    problem = refused(RAY + "resources_per_worker:\n  CPU: 4\nvastai:\n  gpu_count: 4\n  min_vcpu_count: 8\n")
    assert (problem.path, problem.line) == ("resources_per_worker", 6)
    assert problem.message.startswith(
        "4 workers x {CPU: 4, GPU: 1} need 16 CPUs; vastai.min_vcpu_count: 8 x num_nodes: 1 has 8; "
        "raise vastai.min_vcpu_count"
    )


def test_two_cpu_workers_fit_two_cpus() -> None:
    # Ray Train 2.60's controller and the job's driver take no CPU: 2 x {CPU: 1} run on num_cpus 2.
    assert workers(RAY + "ray_num_workers: 2\nlocal:\n  num_cpus: 2\n") == 2


def test_more_than_one_gpu_without_ray_is_refused_for_the_builtin_recipe() -> None:
    problem = refused(BUILTIN + "runpod:\n  gpu_count: 4\n")
    assert (problem.path, problem.line) == ("runpod.gpu_count", 6)
    assert problem.message == (
        "4 without use_ray trains on one GPU; set use_ray: true (one Ray worker per GPU), or gpu_count: 1"
    )
    assert refused(BUILTIN + "local:\n  num_gpus: 2\n").path == "local.num_gpus"
    # axolotl without Ray launches with accelerate, one process per GPU of the node: allowed.
    assert isinstance(spec(AXOLOTL + "runpod:\n  gpu_count: 4\n").train, AxolotlConfig)


def test_several_nodes_without_ray_are_refused_for_either_trainer() -> None:
    for head in (BUILTIN, AXOLOTL):
        problem = refused(head + "runpod:\n" + CLUSTER)
        assert problem.path == "runpod.num_nodes" and "trains on the first node only" in problem.message


def test_ray_num_workers_defaults_to_the_nodes_gpus() -> None:
    assert workers(RAY + "runpod:\n  gpu_count: 4\n" + CLUSTER) == 8
    assert workers(RAY + "resources_per_worker:\n  GPU: 2\nrunpod:\n  gpu_count: 4\n") == 2
    assert workers(AXOLOTL + "use_ray: true\nlocal:\n  num_gpus: 2\n") == 2
    assert workers(RAY + "local:\n  num_cpus: 1\n") == 1  # no GPUs: one CPU worker
    # Written, or without Ray: as written.
    assert workers(RAY + "ray_num_workers: 2\nrunpod:\n  gpu_count: 4\n") == 2
    assert workers(BUILTIN + "runpod:\n  gpu_count: 1\n") == 1
    # The resolved number is what the ledger keeps and the node gets (workers.node_job's TrainJob).
    four = spec(RAY + "runpod:\n  gpu_count: 4\n")
    assert JobSpec.model_validate_json(four.model_dump_json()).train.ray_num_workers == 4


def test_a_multi_node_shape_that_fits_is_accepted() -> None:
    shape = "resources_per_worker:\n  CPU: 2\n  GPU: 1\nrunpod:\n  gpu_count: 2\n  min_vcpu_count: 4\n"
    assert workers(RAY + "ray_num_workers: 4\n" + shape + CLUSTER) == 4


def test_a_worker_larger_than_one_node_is_refused_though_the_cluster_has_enough() -> None:
    problem = refused(
        RAY + "ray_num_workers: 1\nresources_per_worker:\n  GPU: 4\nrunpod:\n  gpu_count: 2\n" + CLUSTER
    )
    assert (problem.path, problem.line) == ("ray_num_workers", 6)
    assert problem.message.startswith(
        "a worker's {GPU: 4} is placed whole on one node, and runpod.gpu_count: 2 gives a node 2 GPUs"
    )
    # Whole workers per node: 4 x {GPU: 3} on three 4-GPU nodes is 12 of 12 GPUs, but one worker a node.
    three = "runpod:\n  gpu_count: 4\n  num_nodes: 3\n  network_volume_id: vol-abc123\n"
    message = refused(RAY + "ray_num_workers: 4\nresources_per_worker:\n  GPU: 3\n" + three).message
    assert "has 12, but whole workers fit 1 per node (3 in all); lower ray_num_workers to 3" in message


def test_fractional_gpus_share_a_gpu() -> None:
    assert (
        workers(RAY + "ray_num_workers: 2\nresources_per_worker:\n  GPU: 0.5\nrunpod:\n  gpu_count: 1\n") == 2
    )


def test_the_worker_bundle_is_ray_trains() -> None:
    # A zero amount is dropped and a GPU worker always gets its GPU (Ray Train's ScalingConfig).
    gpu_node = spec(RAY + "resources_per_worker:\n  CPU: 2\n  GPU: 0\nrunpod:\n  gpu_count: 1\n")
    (shape,) = cluster_shape(gpu_node.provider, gpu_node.section)
    gpus = shape.gpus
    assert worker_bundle(gpu_node.train, gpus) == {"CPU": 2.0, "GPU": 1.0}
    assert worker_bundle(spec(RAY + "local:\n  num_cpus: 1\n").train, 0) == {"CPU": 1.0}
