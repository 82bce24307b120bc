"""A cluster whose head has its own shape (`head:` in the runpod section) and workers pinned to a GPU type
(`accelerator_type:<GPU>` in resources_per_worker): what validate accepts, refuses (with the reason, the
key and its line), how many workers a job gets by default, and which section rents each node."""

from __future__ import annotations

from pathlib import Path

import pytest
from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager

from core.errors import ConfigError, Problem
from jobs.spec import JobSpec, parse_job
from jobs.topology import cluster_shape
from providers.runpod.section import RunPodSection

REPO = Path(__file__).resolve().parents[2]
RAY = (
    "base_model: trainfleet/tiny-llama\ndatasets:\n  - path: tatsu-lab/alpaca\nadapter: lora\nuse_ray: true\n"
)
PIN_L40S = "resources_per_worker:\n  GPU: 1\n  accelerator_type:L40S: 0.001\n"  # lines 6-8
# The seed's cluster as RunPod can rent it: a small-GPU head and two 4 x L40S nodes.
CLUSTER = (
    "runpod:\n  gpu: NVIDIA L40S\n  gpu_count: 4\n  num_nodes: 3\n  network_volume_id: vol-abc123\n"
    "  head:\n    gpu: NVIDIA RTX A4000\n    gpu_count: 1\n    min_vcpu_count: 4\n"
)


def spec(text: str) -> JobSpec:
    return parse_job(text.encode(), source="job.yml", base_dir=REPO).spec


def refused(text: str) -> Problem:
    with pytest.raises(ConfigError) as info:
        spec(text)
    (problem,) = info.value.problems
    return problem


def test_the_head_is_rented_with_its_own_keys_and_the_others_with_the_sections() -> None:
    job = spec(RAY + PIN_L40S + CLUSTER)
    section = job.section
    assert isinstance(section, RunPodSection)
    head = section.node_section(0)
    assert (head.gpu, head.gpu_count, head.min_vcpu_count, head.head) == ("NVIDIA RTX A4000", 1, 4, None)
    # What the head leaves out is the section's; it is still a node of the cluster (global networking).
    assert (head.num_nodes, head.network_volume_id, head.min_memory_in_gb) == (3, "vol-abc123", 29)
    for k in (1, 2):
        assert section.node_section(k) is section
    assert (job.head_gpu_count, job.gpu_count) == (1, 4)  # the head's readiness check asks for 1 GPU


def test_pinned_workers_default_to_the_gpus_of_the_nodes_with_that_gpu() -> None:
    # The head's A4000 holds no L40S-pinned worker: 2 nodes x 4 GPUs = 8 workers, not 9.
    assert spec(RAY + PIN_L40S + CLUSTER).train.ray_num_workers == 8
    head, others = cluster_shape(
        spec(RAY + PIN_L40S + CLUSTER).provider, spec(RAY + PIN_L40S + CLUSTER).section
    )
    assert (head.head, head.nodes, head.accelerator) == (True, 1, "RTX-A4000")
    assert (others.head, others.nodes, others.accelerator) == (False, 2, "L40S")


def test_more_pinned_workers_than_the_pinned_nodes_hold_are_refused_with_the_numbers() -> None:
    problem = refused(RAY + "ray_num_workers: 9\n" + PIN_L40S + CLUSTER)
    assert (problem.path, problem.line) == ("ray_num_workers", 6)
    assert problem.message == (
        "9 workers x {GPU: 1, accelerator_type:L40S: 0.001} need 9 GPUs; runpod.gpu_count: 4 x 2 other "
        "nodes has 8; lower ray_num_workers to 8 or raise runpod.gpu_count"
    )


def test_unpinned_workers_on_a_cluster_of_different_gpus_are_refused_with_the_pin_to_write() -> None:
    problem = refused(RAY + CLUSTER)
    assert problem.path == "resources_per_worker"
    assert problem.message.startswith(
        "the cluster's GPUs differ (runpod.head.gpu: NVIDIA RTX A4000 (RTX-A4000 to Ray), runpod.gpu: "
        "NVIDIA L40S (L40S to Ray)) and resources_per_worker does not say which the workers train on"
    )
    assert "resources_per_worker: {accelerator_type:L40S: 0.001}" in problem.message
    # The same GPU type on the head (more vCPUs, fewer GPUs): nothing to pin; 1 + 2 x 4 workers.
    same = CLUSTER.replace("gpu: NVIDIA RTX A4000", "gpu: NVIDIA L40S")
    assert spec(RAY + same).train.ray_num_workers == 9


def test_a_pin_no_node_has_is_refused_naming_what_the_nodes_have() -> None:
    problem = refused(RAY + PIN_L40S.replace("L40S", "H100") + CLUSTER)
    assert (problem.path, problem.line) == ("resources_per_worker", 6)
    assert problem.message.startswith(
        "accelerator_type:H100 places the workers only on nodes with that GPU, and this job's nodes have "
        "none "
        "(runpod.head.gpu: NVIDIA RTX A4000 (RTX-A4000 to Ray); runpod.gpu: NVIDIA L40S (L40S to Ray))"
    )
    # One node too: the pin is checked against the GPU RunPod rents; vast.ai's names are not the driver's.
    single = "runpod:\n  gpu: NVIDIA RTX A5000\n"
    assert refused(RAY + PIN_L40S + single).path == "resources_per_worker"
    assert spec(RAY + PIN_L40S.replace("L40S", "RTX-A5000") + single).train.ray_num_workers == 1
    assert spec(RAY + PIN_L40S + "vastai:\n  gpu: RTX_A5000\n").train.ray_num_workers == 1


def test_a_head_without_a_cluster_is_refused() -> None:
    problem = refused(RAY + "runpod:\n  head:\n    gpu_count: 2\n")
    assert (problem.path, problem.line) == ("runpod.head", 7)
    assert "num_nodes: 1 is no cluster" in problem.message


def test_a_cpu_only_head_is_refused_on_runpod_with_the_reason() -> None:
    problem = refused(RAY + PIN_L40S + CLUSTER.replace("gpu_count: 1\n", "gpu_count: 0\n"))
    assert (problem.path, problem.line) == ("runpod.head.gpu_count", 16)
    assert problem.message.startswith(
        "a CPU-only head cannot be part of a RunPod cluster: RunPod's global networking, which joins a "
        "cluster's pods on one private network, is for NVIDIA GPU pods only"
    )


def test_the_heads_keys_are_strict() -> None:
    problem = refused(RAY + PIN_L40S + CLUSTER + "    stop_after: 60\n")
    assert problem.path == "runpod.head.stop_after"


@pytest.mark.parametrize(
    "gpu",
    [
        "NVIDIA L40S",
        "NVIDIA RTX A5000",
        "NVIDIA A100 80GB PCIe",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA H100 80GB HBM3",
        "NVIDIA H200",
        "NVIDIA GeForce RTX 4090",
        "NVIDIA RTX 6000 Ada Generation",
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "Tesla V100-SXM2-16GB",
    ],
)
def test_runpods_gpu_ids_get_the_accelerator_type_ray_gives_them(gpu: str) -> None:
    assert RunPodSection.accelerator_type(gpu) == NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(
        gpu
    )


@pytest.mark.parametrize(("key", "line"), [("data_center: [EU-RO-1]", 8), ("avoid: [Europe]", 8)])
def test_a_network_volume_decides_where_its_pods_go(key: str, line: int) -> None:
    problem = refused(RAY + f"runpod:\n  network_volume_id: vol-abc123\n  {key}\n")
    assert (problem.path, problem.line) == (f"runpod.{key.split(':')[0]}", line)
    assert "a network volume's pods go where the volume is" in problem.message


def test_a_data_center_is_one_id_or_a_list_of_them() -> None:
    one = spec(RAY + "runpod:\n  data_center: EU-RO-1\n").section
    assert isinstance(one, RunPodSection) and one.data_center == ("EU-RO-1",)
    problem = refused(RAY + "runpod:\n  data_center: [EU-RO-1, europe]\n")
    assert problem.path == "runpod.data_center[1]" and "RunPod data center id" in problem.message
