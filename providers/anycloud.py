"""The offers for a `cloud:` job from every cloud it allows, ranked together: the pools it names first, then
the rentals, cheapest first.

For each allowed cloud the fleet has credentials for, and each GPU type the section names, the cloud's own
section for that type (CloudSection.on) is priced by the cloud's chooser (providers.offers via the
provider's `choose`), so an offer is judged by the same rules as a `runpod:` or `vastai:` job's. The fits
of all clouds are merged by price; an offer left out keeps every reason; a cloud that could not be asked
(no credentials, `avoid` on a cloud that does not say where its offers are, its API failing) says why, so
`fleet offers` and a failed run can name it. A pool the section names (`ssh:lab`) offers each of its free
machines that fit (the owned provider's `list_offers` of CloudSection.on_machines), smallest first; they
come before every rental whatever they cost (the operator has them already), but never above
`max_bid_per_gpu` per GPU asked for. A pool whose machines that fit are all held now is `held`: a run with
nothing else to rent waits for it. Nothing here creates anything."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from core.errors import FleetError
from jobs import clouds
from jobs.gpus import GpuType
from jobs.sections import CloudSection, ProviderName
from providers.base import Provider
from providers.offers import HELD_BY, Candidate, Priced, Rejected, in_avoided, same_gpu
from providers.remote import RemoteProvider


@dataclass(frozen=True)
class CloudOffer:
    """An offer that fits, with the fleet's name for its GPU type and the cloud's (how its section is
    written)."""

    gpu: str
    vendor_gpu: str
    priced: Priced

    @property
    def cloud(self) -> ProviderName:
        return self.priced.candidate.provider

    @property
    def key(self) -> str:
        return self.priced.candidate.key


@dataclass(frozen=True)
class CloudChoice:
    """Every cloud's fits for the job, cheapest first; the offers of its GPU types left out, and why; and
    the clouds not asked, and why."""

    fits: tuple[CloudOffer, ...]
    rejected: tuple[Rejected, ...]
    unasked: tuple[tuple[str, str], ...]
    """Each cloud (or pool: `ssh:lab`) not asked, and why."""
    errors: tuple[FleetError, ...] = ()
    """What the clouds that failed to answer raised (among `unasked`): whether asking again may help."""
    held: tuple[str, ...] = ()
    """The pools (`ssh:lab`) whose machines that fit are all held by other runs now."""

    def best(self, tried: Iterable[str] = ()) -> CloudOffer | None:
        """The cheapest fit whose `key` is not in `tried`."""
        skip = set(tried)
        return next((o for o in self.fits if o.key not in skip), None)


Provide = Callable[[ProviderName], Provider]


def why_not_asked(
    section: CloudSection, cloud: ProviderName, fleet_runs: Collection[str] | None
) -> str | None:
    """Why `cloud` (a rented cloud, or a pool's owned provider) is not asked for the section, or None (it
    is); `fleet_runs`: the providers the fleet runs jobs on (settings.providers; None: all)."""
    if fleet_runs is not None and cloud.value not in fleet_runs:
        return "this fleet does not run it (FLEET_PROVIDERS)"
    if section.avoid and (facts := clouds.facts(cloud)) and not facts.location.supported:
        return facts.location.reason
    return None


def clouds_to_ask(
    section: CloudSection, fleet_runs: Collection[str] | None = None
) -> list[tuple[ProviderName, str | None]]:
    """Each rented cloud the section allows, with why it is not asked (None: it is)."""
    return [(cloud, why_not_asked(section, cloud, fleet_runs)) for cloud in section.rented]


def pools_to_ask(
    section: CloudSection, fleet_runs: Collection[str] | None = None
) -> list[tuple[ProviderName, str, str | None]]:
    """Each pool the section names: its owned provider, the pool, and why it is not asked (None: it is)."""
    refused = section.pool_refusal()
    out = []
    for owner, pool in section.pools:
        why = why_not_asked(section, owner, fleet_runs)
        out.append((owner, pool, why or (f"{refused[1]} ({refused[0]})" if refused else None)))
    return out


def _in_size(t: GpuType, c: Candidate) -> str | None:
    """Why `c` is not `t` though the cloud calls both the same (vast.ai's A100 PCIE is 40 or 80 GB)."""
    shared = t.sharing_names(c.provider)
    said = c.detail.get("gpu_memory_gb", "")
    if not shared:
        return None
    low, high = t.memory_range
    try:
        have = float(said)
    except ValueError:
        return f"GPU memory unknown: cannot tell a {t.name} from a {shared[0].name}"
    return None if low <= have <= high else f"{have:g} GB per GPU: not a {t.name}"


def _short_of_memory(section: CloudSection, c: Candidate) -> str | None:
    """`min_gpu_ram_in_gb` on every cloud (vast.ai's chooser checks it too; RunPod's has no such key)."""
    need = section.min_gpu_ram_in_gb
    if need is None:
        return None
    try:
        have = float(c.detail.get("gpu_memory_gb", ""))
    except ValueError:
        return f"GPU memory unknown (the job asks for at least {need} GB)"
    return f"GPU memory {have:g} GB < {need} GB" if have < need else None


def _avoided(section: CloudSection, c: Candidate) -> str | None:
    if not section.avoid:
        return None
    if not c.detail.get("location"):  # an offer that does not say where it is may be in those places
        return "it does not say where it is, and the job avoids places (avoid)"
    return in_avoided(c, section.avoid)


def rank(section: CloudSection, provide: Provide, fleet_runs: Collection[str] | None = None) -> CloudChoice:
    """Every allowed cloud's offers for every GPU type of `section`, priced, cheapest first. `provide`
    makes a cloud's provider (FleetError, e.g. CredentialsMissing: that cloud is not asked, and why);
    `fleet_runs` (settings.providers) leaves out the clouds the fleet does not run."""
    fits: dict[str, CloudOffer] = {}
    rejected: dict[str, Rejected] = {}
    unasked: list[tuple[str, str]] = []
    errors: list[FleetError] = []
    owned, held = _pools(section, provide, fleet_runs, rejected, unasked, errors)
    for cloud, why_not in clouds_to_ask(section, fleet_runs):
        if why_not is not None:
            unasked.append((cloud, why_not))
            continue
        try:
            provider = cast(RemoteProvider[Any, Any], provide(cloud))  # a rented cloud's: it chooses offers
            refused = provider.refusal(section)  # the shared keys it cannot honour (a private image)
            if refused is not None:
                unasked.append((cloud, refused.why))
                continue
            for t in section.types:
                for vendor_gpu in t.vendor_names(cloud):
                    _price(section, provider, t, vendor_gpu, fits, rejected)
        except FleetError as exc:
            unasked.append((cloud, str(exc)))
            errors.append(exc)
            continue
        if not any(t.vendor_names(cloud) for t in section.types):
            names = ", ".join(t.name for t in section.types)
            unasked.append((cloud, f"it rents no {names}"))
    ordered = [*owned, *sorted(fits.values(), key=lambda o: (o.priced.price_per_hour, o.key))]
    return CloudChoice(tuple(ordered), tuple(rejected.values()), tuple(unasked), tuple(errors), held)


def _pools(
    section: CloudSection,
    provide: Provide,
    fleet_runs: Collection[str] | None,
    rejected: dict[str, Rejected],
    unasked: list[tuple[str, str]],
    errors: list[FleetError],
) -> tuple[list[CloudOffer], tuple[str, ...]]:
    """The free machines that fit of every pool the section names, in its order, each pool's smallest
    first; and the pools whose machines that fit within the price cap are all held."""
    fits: list[CloudOffer] = []
    held: list[str] = []
    cap = section.max_bid_per_gpu
    for owner, pool, why_not in pools_to_ask(section, fleet_runs):
        where = f"{owner.value}:{pool}"
        if why_not is not None:
            unasked.append((where, why_not))
            continue
        try:
            provider = provide(owner)
            own = section.on_machines(owner, pool)
            refused = provider.refusal(own)  # no such pool, or none of its machines ever fits
            offers = provider.list_offers(own) if refused is None else []
        except FleetError as exc:
            unasked.append((where, str(exc)))
            errors.append(exc)
            continue
        if refused is not None:
            unasked.append((where, refused.why))
        found, waits = 0, False
        for o in offers:
            c = Candidate(
                owner, o.offer_id, o.gpu or "", o.gpu_count, o.price_per_hour, None, None, None, True
            )
            per_gpu = o.price_per_hour / section.gpu_count
            why = (
                [f"${per_gpu:.3f}/GPU/h (hourly_usd) is above max_bid_per_gpu ${cap:.3f}"]
                if per_gpu > cap
                else []
            )
            if (holder := o.detail.get(HELD_BY)) is not None:
                waits = waits or not why
                why.append(f"held by run {holder}")
            if why:
                rejected.setdefault(c.key, Rejected(c, tuple(why)))
            else:
                fits.append(CloudOffer(c.gpu, c.gpu, Priced(c, o.price_per_hour, None)))
                found += 1
        if waits and not found:
            held.append(where)
    return fits, tuple(held)


def _price(
    section: CloudSection,
    provider: RemoteProvider[Any, Any],
    t: GpuType,
    vendor_gpu: str,
    fits: dict[str, CloudOffer],
    rejected: dict[str, Rejected],
) -> None:
    """One cloud's offers for one of its names of GPU type `t`, into `fits` and `rejected`."""
    choice = provider.choose(section.on(provider.name, vendor_gpu))
    for p in choice.fits:
        c = p.candidate
        extra = [r for r in (_in_size(t, c), _short_of_memory(section, c), _avoided(section, c)) if r]
        if extra:
            rejected.setdefault(c.key, Rejected(c, tuple(extra)))
        else:
            fits.setdefault(c.key, CloudOffer(t.name, vendor_gpu, p))
    for r in choice.rejected:  # the offers of the type asked for; another type's are not this job's
        if same_gpu(r.candidate.gpu, vendor_gpu):
            rejected.setdefault(r.candidate.key, r)


def providers_of(make: Callable[[str], Provider]) -> Provide:
    """Each cloud's provider as `make` gives it by name (a world's, `providers.world.World.provider`); `rank`
    asks for each cloud once."""
    return lambda cloud: make(cloud.value)


def summary(choice: CloudChoice, tried: Mapping[str, str] | None = None) -> str:
    """What was asked and found, for a run that found nothing (more) to rent: the offers tried and why
    each was left, the clouds not asked and why."""
    parts = [f"{key} ({why})" for key, why in (tried or {}).items()]
    parts += [f"{cloud} not asked: {why}" for cloud, why in choice.unasked]
    if not choice.fits and not tried:
        parts.append(f"{len(choice.rejected)} offer(s) of the GPU types asked for, none fits")
    return "; ".join(parts) or "no cloud was asked"
