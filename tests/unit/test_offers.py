"""Offer choice: filtering by the section, pricing, the bid cap, and saying why."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.sections import ProviderName
from providers.offers import Candidate, choose, same_gpu
from providers.runpod.section import RunPodSection


def cand(offer_id: str = "o1", **kw: Any) -> Candidate:
    values: dict[str, Any] = {
        "provider": ProviderName("runpod"),
        "offer_id": offer_id,
        "gpu": "NVIDIA RTX A5000",
        "gpu_count": 1,
        "on_demand_per_hour": 0.5,
        "min_bid_per_gpu": 0.2,
        "vcpus": 16,
        "memory_gb": 64,
        "secure": True,
    }
    values.update(kw)
    return Candidate(**values)


def test_interruptible_bids_the_minimum_and_ranks_cheapest_first() -> None:
    section = RunPodSection(pod_type="INTERRUPTABLE", gpu_count=2, max_bid_per_gpu=0.5)
    choice = choose(
        section,
        "NVIDIA RTX A5000",
        [cand("b", gpu_count=2, min_bid_per_gpu=0.30), cand("a", gpu_count=2, min_bid_per_gpu=0.25)],
    )
    assert [p.candidate.offer_id for p in choice.fits] == ["a", "b"]
    assert choice.best is not None and choice.best.bid_per_gpu == 0.25 and choice.best.price_per_hour == 0.5


def test_every_left_out_offer_says_why() -> None:
    section = RunPodSection(
        pod_type="INTERRUPTABLE", max_bid_per_gpu=0.5, min_download=500, cloud_type="SECURE"
    )
    choice = choose(
        section,
        "nvidia_rtx_a5000",  # vast.ai's spelling matches too
        [
            cand("pricey", min_bid_per_gpu=0.9),
            cand("community", secure=False, download_mbps=900),
            cand("slow", download_mbps=100),
            cand("small", vcpus=4, memory_gb=16),
            cand("other-gpu", gpu="NVIDIA A100 80GB PCIe"),
            cand("no-spot", min_bid_per_gpu=None),
            cand("ok", download_mbps=1000),
        ],
    )
    assert [p.candidate.offer_id for p in choice.fits] == ["ok"]
    why = {r.candidate.offer_id: " | ".join(r.reasons) for r in choice.rejected}
    assert "minimum bid $0.900/GPU/h is above max_bid_per_gpu $0.500" in why["pricey"]
    assert "community host" in why["community"]
    assert "download 100 Mbps < 500 Mbps" in why["slow"]
    assert "vCPUs 4 < 8" in why["small"] and "memory 16 GB < 29 GB" in why["small"]
    assert "gpu is NVIDIA A100 80GB PCIe" in why["other-gpu"]
    assert "no interruptible rental" in why["no-spot"]


def test_on_demand_uses_the_list_price_under_the_cap() -> None:
    section = RunPodSection(pod_type="ON_DEMAND", max_bid_per_gpu=0.4, gpu_count=2)
    choice = choose(
        section,
        "NVIDIA RTX A5000",
        [cand("x", gpu_count=2, on_demand_per_hour=0.7), cand("y", gpu_count=2, on_demand_per_hour=0.9)],
    )
    assert [(p.candidate.offer_id, p.price_per_hour, p.bid_per_gpu) for p in choice.fits] == [
        ("x", 0.7, None)
    ]
    assert "on-demand $0.450/GPU/h is above max_bid_per_gpu $0.400" in choice.rejected[0].reasons


def test_auto_prices_spot_first_then_on_demand_and_says_both_when_neither_fits() -> None:
    section = RunPodSection(pod_type="auto", max_bid_per_gpu=0.4)
    offers = [
        cand("spot", min_bid_per_gpu=0.2, on_demand_per_hour=0.3),
        cand("no-spot", min_bid_per_gpu=None, on_demand_per_hour=0.35),
        cand("neither", min_bid_per_gpu=0.45, on_demand_per_hour=0.9),
    ]
    choice = choose(section, "NVIDIA RTX A5000", offers)
    assert [(p.candidate.offer_id, p.bid_per_gpu) for p in choice.fits] == [("spot", 0.2), ("no-spot", None)]
    (left,) = choice.rejected
    assert left.reasons == (
        "minimum bid $0.450/GPU/h is above max_bid_per_gpu $0.400; "
        "on-demand $0.900/GPU/h is above max_bid_per_gpu $0.400",
    )
    # A run rents spot until it left spot, then on demand (Run.node_section reads this).
    assert (section.renting(None).pod_type, section.renting("no spot").pod_type) == (
        "INTERRUPTABLE",
        "ON_DEMAND",
    )
    assert RunPodSection(pod_type="INTERRUPTABLE").renting("no spot").pod_type == "INTERRUPTABLE"


def test_vendor_rules_can_leave_offers_out() -> None:
    choice = choose(RunPodSection(), "NVIDIA RTX A5000", [cand("u")], rules=[lambda c: "unverified host"])
    assert choice.fits == () and choice.rejected[0].reasons == ("unverified host",)


def test_same_gpu() -> None:
    assert same_gpu("RTX_A6000", "rtx a6000") and not same_gpu("RTX A6000", "RTX A5000")


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    bids=st.lists(st.one_of(st.none(), st.floats(0.01, 5.0)), min_size=1, max_size=12),
    cap=st.floats(0.05, 4.0),
    count=st.integers(1, 4),
)
def test_never_bids_above_the_cap_and_accounts_for_every_offer(
    bids: list[float | None], cap: float, count: int
) -> None:
    section = RunPodSection(pod_type="INTERRUPTABLE", max_bid_per_gpu=cap, gpu_count=count)
    offers = [cand(f"o{i}", min_bid_per_gpu=b, gpu_count=count) for i, b in enumerate(bids)]
    choice = choose(section, "NVIDIA RTX A5000", offers)
    assert len(choice.fits) + len(choice.rejected) == len(offers)
    for p in choice.fits:
        assert p.bid_per_gpu is not None and p.bid_per_gpu <= cap
        assert abs(p.price_per_hour - p.bid_per_gpu * count) < 1e-6
    prices = [p.price_per_hour for p in choice.fits]
    assert prices == sorted(prices)
    assert all(r.reasons for r in choice.rejected)
    cheapest_fitting = min((b for b in bids if b is not None and b <= cap), default=None)
    assert (choice.best.bid_per_gpu if choice.best else None) == cheapest_fitting
