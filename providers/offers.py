"""Choosing an offer: every cloud's offers, normalised, filtered by the job's section and ranked by price.

A provider adapter turns its vendor's catalogue into `Candidate`s; `choose` keeps those that fit the
section, prices them the way the rental would be made (a bid for INTERRUPTABLE, the list price for
ON_DEMAND) and says, for every one it leaves out, why. Nothing here talks to a network.

Money rule: an interruptible rental bids the offer's minimum bid per GPU and never more than the
section's `max_bid_per_gpu`; an on-demand rental whose price per GPU is above it is left out too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from jobs.clouds import avoided
from jobs.sections import ProviderName
from jobs.sections.base import RemoteSection


@dataclass(frozen=True)
class Candidate:
    """One thing a cloud can rent out now, in the fleet's terms (prices in USD per hour)."""

    provider: ProviderName
    offer_id: str
    gpu: str
    gpu_count: int
    on_demand_per_hour: float | None  # the whole machine; None: not rentable on demand
    min_bid_per_gpu: float | None  # None: no interruptible rental
    vcpus: float | None  # None: not said (a pool's machine)
    memory_gb: float | None
    secure: bool  # a datacenter (RunPod SECURE / vast.ai datacenter) host, or the operator's own
    download_mbps: float | None = None
    upload_mbps: float | None = None
    disk_gb: float | None = None
    detail: dict[str, str] = field(default_factory=dict)
    """What else the cloud says of it: `location` (where, matched against `avoid`), `data_center` (the one
    the create call must name), the GPU's display name and memory."""

    @property
    def key(self) -> str:
        """The offer's identity across clouds (`runpod:NVIDIA A100 80GB PCIe/SECURE`, `vastai:1001`)."""
        return f"{self.provider.value}:{self.offer_id}"


@dataclass(frozen=True)
class Priced:
    """A candidate that fits, with the rental it would be: `bid_per_gpu` is None for on-demand."""

    candidate: Candidate
    price_per_hour: float
    bid_per_gpu: float | None


@dataclass(frozen=True)
class Rejected:
    """A candidate left out, with every reason (so `fleet offers` can say all of them)."""

    candidate: Candidate
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Choice:
    """The outcome of `choose`: what fits, cheapest first, and what was left out, and why."""

    fits: tuple[Priced, ...]
    rejected: tuple[Rejected, ...]

    @property
    def best(self) -> Priced | None:
        return self.fits[0] if self.fits else None


DATA_CENTER = "data_center"  # a Candidate.detail key: the data center a create names (RunPod's dataCenterId)
HELD_BY = "held_by"  # a providers.base.Offer.detail key: the run that holds an owned machine now (not free)
Rule = Callable[[Candidate], str | None]
"""A vendor-specific check: the reason to leave a candidate out, or None."""


def in_avoided(c: Candidate, avoid: Iterable[str]) -> str | None:
    """Why `c` is left out for being where the job avoids (jobs.clouds.avoided), or None (it says nowhere,
    or nowhere avoided)."""
    where = c.detail.get("location", "")
    hit = avoided(where, avoid) if where else None
    return f"in {where}, which the job avoids ({hit})" if hit else None


def same_gpu(a: str, b: str) -> bool:
    """GPU names compare without case, and `_` stands for a space (as vast.ai's query syntax has it)."""
    return " ".join(a.replace("_", " ").lower().split()) == " ".join(b.replace("_", " ").lower().split())


def _shortfall(label: str, have: float | None, need: float | None, unit: str) -> str | None:
    if need is None:
        return None
    if have is None:
        return f"{label} unknown (the job asks for at least {need:g}{unit})"
    return f"{label} {have:g}{unit} < {need:g}{unit}" if have < need else None


def reasons_against(section: RemoteSection, gpu: str, c: Candidate) -> list[str]:
    """Why `c` does not fit the section's hardware and placement asks (empty: it fits)."""
    reasons = []
    if not same_gpu(c.gpu, gpu):
        reasons.append(f"gpu is {c.gpu}, the job asks for {gpu}")
    if c.gpu_count != section.gpu_count:
        reasons.append(f"{c.gpu_count} GPU(s), the job asks for {section.gpu_count}")
    if section.cloud_type == "SECURE" and not c.secure:
        reasons.append("a community host; cloud_type is SECURE")
    if section.cloud_type == "COMMUNITY" and c.secure:
        reasons.append("a secure-cloud host; cloud_type is COMMUNITY")
    checks = (
        _shortfall("vCPUs", c.vcpus, section.min_vcpu_count, ""),
        _shortfall("memory", c.memory_gb, section.min_memory_in_gb, " GB"),
        _shortfall("download", c.download_mbps, section.min_download, " Mbps"),
        _shortfall("upload", c.upload_mbps, section.min_upload, " Mbps"),
        _shortfall("disk", c.disk_gb, section.container_disk_in_gb, " GB") if c.disk_gb is not None else None,
    )
    reasons += [r for r in checks if r]
    return reasons


def price(section: RemoteSection, c: Candidate) -> Priced | str:
    """The rental the section would make of `c`, or the reason it cannot be made within the cap."""
    cap = section.max_bid_per_gpu
    if section.pod_type == "INTERRUPTABLE":
        return _by_bid(c, cap)
    if section.pod_type == "ON_DEMAND":
        return _on_demand(c, cap)
    spot = _by_bid(c, cap)  # auto: spot first (a run leaves it later: RemoteSection.renting)
    if isinstance(spot, Priced):
        return spot
    demand = _on_demand(c, cap)
    return demand if isinstance(demand, Priced) else f"{spot}; {demand}"


def _by_bid(c: Candidate, cap: float) -> Priced | str:
    """A spot rental of `c` at its minimum bid, or why there is none within `cap` per GPU."""
    if c.min_bid_per_gpu is None:
        return "no interruptible rental offered; pod_type is INTERRUPTABLE"
    if c.min_bid_per_gpu > cap:
        return f"minimum bid ${c.min_bid_per_gpu:.3f}/GPU/h is above max_bid_per_gpu ${cap:.3f}"
    bid = c.min_bid_per_gpu
    return Priced(c, round(bid * c.gpu_count, 6), bid)


def _on_demand(c: Candidate, cap: float) -> Priced | str:
    """An on-demand rental of `c` at its list price, or why there is none within `cap` per GPU."""
    if c.on_demand_per_hour is None:
        return "not rentable on demand; pod_type is ON_DEMAND"
    per_gpu = c.on_demand_per_hour / max(c.gpu_count, 1)
    if per_gpu > cap:
        return f"on-demand ${per_gpu:.3f}/GPU/h is above max_bid_per_gpu ${cap:.3f}"
    return Priced(c, c.on_demand_per_hour, None)


def choose(
    section: RemoteSection, gpu: str, candidates: Iterable[Candidate], rules: Sequence[Rule] = ()
) -> Choice:
    """Filter `candidates` by the section (and vendor `rules`), price them, cheapest first."""
    fits: list[Priced] = []
    rejected: list[Rejected] = []
    for c in candidates:
        reasons = reasons_against(section, gpu, c) + [r for rule in rules if (r := rule(c))]
        priced = price(section, c)
        if isinstance(priced, str):
            reasons.append(priced)
        if reasons or isinstance(priced, str):
            rejected.append(Rejected(c, tuple(reasons)))
        else:
            fits.append(priced)
    fits.sort(key=lambda p: (p.price_per_hour, p.candidate.offer_id))
    return Choice(tuple(fits), tuple(rejected))
