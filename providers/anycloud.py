"""The offers for a `cloud:` job from every cloud it allows, ranked together, cheapest first.

For each allowed cloud the fleet has credentials for, and each GPU type the section names, the cloud's own
section for that type (CloudSection.on) is priced by the cloud's chooser (providers.offers via the
provider's `choose`), so an offer is judged by the same rules as a `runpod:` or `vastai:` job's. The fits
of all clouds are merged by price; an offer left out keeps every reason; a cloud that could not be asked
(no credentials, `avoid` on a cloud that does not say where its offers are, its API failing) says why, so
`fleet offers` and a failed run can name it. Nothing here creates anything.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from core.errors import FleetError
from jobs import clouds
from jobs.gpus import GpuType
from jobs.sections import CloudSection, ProviderName
from providers.base import Provider
from providers.offers import Candidate, Priced, Rejected, in_avoided, same_gpu
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
    unasked: tuple[tuple[ProviderName, str], ...]
    errors: tuple[FleetError, ...] = ()
    """What the clouds that failed to answer raised (among `unasked`): whether asking again may help."""

    def best(self, tried: Iterable[str] = ()) -> CloudOffer | None:
        """The cheapest fit whose `key` is not in `tried`."""
        skip = set(tried)
        return next((o for o in self.fits if o.key not in skip), None)


Provide = Callable[[ProviderName], RemoteProvider[Any, Any]]


def clouds_to_ask(
    section: CloudSection, fleet_runs: Collection[str] | None = None
) -> list[tuple[ProviderName, str | None]]:
    """Each cloud the section allows, with why it is not asked (None: it is); `fleet_runs`: the providers
    the fleet runs jobs on (settings.providers; None: all)."""
    out: list[tuple[ProviderName, str | None]] = []
    for cloud in section.clouds:
        why = None
        if fleet_runs is not None and cloud.value not in fleet_runs:
            why = "this fleet does not run it (FLEET_PROVIDERS)"
        elif section.avoid and (facts := clouds.facts(cloud)) and not facts.location.supported:
            why = facts.location.reason
        out.append((cloud, why))
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
    unasked: list[tuple[ProviderName, str]] = []
    errors: list[FleetError] = []
    for cloud, why_not in clouds_to_ask(section, fleet_runs):
        if why_not is not None:
            unasked.append((cloud, why_not))
            continue
        try:
            provider = provide(cloud)
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
    ordered = sorted(fits.values(), key=lambda o: (o.priced.price_per_hour, o.key))
    return CloudChoice(tuple(ordered), tuple(rejected.values()), tuple(unasked), tuple(errors))


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

    def provide(cloud: ProviderName) -> RemoteProvider[Any, Any]:
        provider = make(cloud.value)
        assert isinstance(provider, RemoteProvider)
        return provider

    return provide


def summary(choice: CloudChoice, tried: Mapping[str, str] | None = None) -> str:
    """What was asked and found, for a run that found nothing (more) to rent: the offers tried and why
    each was left, the clouds not asked and why."""
    parts = [f"{key} ({why})" for key, why in (tried or {}).items()]
    parts += [f"{cloud.value} not asked: {why}" for cloud, why in choice.unasked]
    if not choice.fits and not tried:
        parts.append(f"{len(choice.rejected)} offer(s) of the GPU types asked for, none fits")
    return "; ".join(parts) or "no cloud was asked"
