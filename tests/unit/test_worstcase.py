"""A run's worst case (state.worstcase): its nodes' GPUs x max_bid_per_gpu x terminate_after, and what
bounds a run with no deadline."""

from __future__ import annotations

import math

from jobs.sections import LocalSection
from jobs.sections.head import HeadShape
from providers.runpod.section import RunPodSection
from providers.ssh.section import SshSection
from providers.vastai.section import VastAISection
from state.worstcase import worst_case
from tests.factories import job_spec


def test_a_rented_node_at_its_ceiling_for_its_lifetime() -> None:
    default = worst_case(job_spec(RunPodSection()), 50.0)  # 1 GPU at $2 for 24 h: fits the default cap
    assert (default.dollars, default.per_hour, default.hours) == (48.0, 2.0, 24.0)
    assert default.text == "$48.00 (1 node x 1 GPU x $2.00/GPU/h (max_bid_per_gpu) x 24 h (terminate_after))"
    four = worst_case(job_spec(VastAISection(gpu_count=4, max_bid_per_gpu=0.5, terminate_after=7200)), None)
    assert four.dollars == 4.0 and four.how.startswith("1 node x 4 GPUs x $0.50/GPU/h")


def test_a_clusters_cpu_head_counts_as_one_gpu() -> None:
    section = RunPodSection(
        gpu_count=4, num_nodes=3, network_volume_id="vol-1", head=HeadShape(gpu_count=0), terminate_after=3600
    )
    worst = worst_case(job_spec(section), 50.0)
    assert worst.dollars == 18.0 and worst.how.startswith("9 GPUs on 3 nodes x $2.00/GPU/h")


def test_the_local_provider_costs_nothing() -> None:
    assert worst_case(job_spec(LocalSection()), 50.0).dollars == 0.0


def test_a_run_with_no_deadline_is_bounded_by_the_per_run_cap_or_by_nothing() -> None:
    endless = RunPodSection(terminate_after=-1)
    assert worst_case(job_spec(endless), 50.0).dollars == 50.0
    assert math.isinf(worst_case(job_spec(endless), None).dollars)
    kept = endless.model_copy(update={"one_shot": False})  # its node may stay a day after a failure
    assert worst_case(job_spec(kept), 50.0).dollars == 50.0 + 2.0 * 24
    idle_for_ever = kept.model_copy(update={"stop_after": -1})
    assert not worst_case(job_spec(idle_for_ever), 50.0).bounded


def test_a_pool_run_at_its_dearest_machines_for_its_lifetime() -> None:
    section = SshSection(pool="lab", gpu_count=0, num_nodes=2, terminate_after=7200)
    worst = worst_case(job_spec(section), 50.0, ceiling=3.2)  # the dearest two machines that fit, per hour
    assert (worst.dollars, worst.per_hour, worst.hours) == (6.4, 3.2, 2.0)
    assert worst.how.startswith("2 nodes at $3.20/h at most (the dearest pool machines that fit: hourly_usd)")
    endless = section.model_copy(update={"terminate_after": -1, "one_shot": False, "stop_after": 3600})
    assert worst_case(job_spec(endless), 50.0, ceiling=3.2).dollars == round(50.0 + 3.2 * 24, 3)  # kept a day
