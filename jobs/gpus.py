"""GPU types in one normal form, with each cloud's own names for them: what a `cloud:` section asks for.

A job that may land on any cloud cannot name a GPU the way one vendor does ("NVIDIA A100 80GB PCIe" on one,
"A100 PCIE" with 80 GB on another): it names the type (`A100-80GB`, `H100`, `RTX-A6000`, `L40S`), and each
cloud's offers are matched against the names that cloud uses for it (declared in its package:
jobs.clouds), plus the memory that tells one size of a model from another where the cloud's name does not.
The names a user writes are read loosely (`a100 80gb`, `NVIDIA RTX A6000`, `RTX_A6000`, `4090`); one that
is none of these is an error that lists the known ones.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from jobs import clouds


@dataclass(frozen=True)
class GpuType:
    """One GPU type: its normal name, the memory of one GPU (GB), and other names a user may write; each
    cloud's own names for it are the cloud's (jobs.clouds.CloudFacts.gpu_names)."""

    name: str
    memory_gb: int
    aliases: tuple[str, ...] = ()

    def vendor_names(self, cloud: str) -> tuple[str, ...]:
        """The cloud's own names for this type (empty: that cloud does not rent it)."""
        facts = clouds.facts(cloud)
        return facts.gpu_names.get(self.name, ()) if facts is not None else ()

    def sharing_names(self, cloud: str) -> list[GpuType]:
        """The other types the cloud calls by one of this type's names (vast.ai's A100 PCIE is 40 or 80
        GB): an offer under such a name is this type only if its memory says so."""
        mine = set(self.vendor_names(cloud))
        return [u for u in _TYPES if u is not self and mine & set(u.vendor_names(cloud))]

    @property
    def memory_range(self) -> tuple[float, float]:
        """Per-GPU memory that counts as this type on a cloud whose name covers several sizes (GB)."""
        return self.memory_gb * 0.95, self.memory_gb * 1.05


_TYPES = (
    GpuType("B200", 180),
    GpuType("H200", 141),
    GpuType("H100-SXM", 80, ("H100-80GB-HBM3",)),
    GpuType("H100-PCIE", 80),
    GpuType("H100-NVL", 94),
    GpuType("A100-80GB", 80),
    GpuType("A100-40GB", 40),
    GpuType("L40S", 48),
    GpuType("L40", 48),
    GpuType("A40", 48),
    GpuType("L4", 24),
    GpuType("RTX-6000-ADA", 48, ("RTX-6000-ADA-GEN",)),
    GpuType("RTX-A6000", 48),
    GpuType("RTX-A5000", 24),
    GpuType("RTX-A4000", 16),
    GpuType("RTX-5090", 32, ("5090",)),
    GpuType("RTX-4090", 24, ("4090",)),
    GpuType("RTX-3090", 24, ("3090",)),
)

GPU_TYPES: Mapping[str, GpuType] = MappingProxyType({t.name: t for t in _TYPES})
"""Every GPU type a `cloud:` section may name, by normal name."""

GROUPS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"H100": ("H100-SXM", "H100-PCIE"), "A100": ("A100-80GB", "A100-40GB")}
)
"""Names that stand for several types: `H100` is either 80 GB H100 (SXM or PCIe), `A100` either size."""


def squash(name: str) -> str:
    """A GPU name in the form names are compared in: upper case, the vendor's brand words dropped, and
    spaces, `_` and `-` as one `-` ("NVIDIA GeForce RTX 4090" and "rtx_4090" are both RTX-4090)."""
    text = re.sub(r"\b(NVIDIA|GEFORCE|TESLA)\b", " ", name.upper())
    text = re.sub(r"(\d+)\s*G(B)?\b", r"\1GB", text)  # "80G", "80 GB" -> 80GB
    return "-".join(re.split(r"[\s_\-]+", text.strip()))


_LOOKUP: tuple[tuple[int, ...], dict[str, tuple[str, ...]]] | None = None


def _lookup() -> dict[str, tuple[str, ...]]:
    """Every name a user may write, squashed, to the types it stands for: the groups, the types' names and
    aliases, then each declared cloud's names (a name a cloud gives to several types stands for each).
    Built once per declaration of the clouds."""
    global _LOOKUP
    declaration = tuple(id(facts) for facts in clouds.declared().values())
    if _LOOKUP is None or _LOOKUP[0] != declaration:
        _LOOKUP = (declaration, _build_lookup())
    return _LOOKUP[1]


def _build_lookup() -> dict[str, tuple[str, ...]]:
    found: dict[str, tuple[str, ...]] = {squash(group): members for group, members in GROUPS.items()}
    for t in _TYPES:
        for said in (t.name, *t.aliases):
            found.setdefault(squash(said), (t.name,))
    for cloud in clouds.declared():
        for t in _TYPES:
            for said in t.vendor_names(cloud):
                found.setdefault(squash(said), tuple(u.name for u in _TYPES if said in u.vendor_names(cloud)))
    return found


def known_names() -> list[str]:
    """The names to offer a user who wrote an unknown one: the types and the groups."""
    return [*GPU_TYPES, *GROUPS]


def resolve(name: str) -> tuple[str, ...]:
    """The GPU types `name` stands for, by normal name; ValueError naming the known ones when none."""
    found = _lookup().get(squash(name))
    if found is not None:
        return found
    close = difflib.get_close_matches(squash(name), [squash(n) for n in known_names()], n=1, cutoff=0.6)
    hint = f" (did you mean {next(n for n in known_names() if squash(n) == close[0])}?)" if close else ""
    raise ValueError(f"unknown GPU type {name!r}{hint}; known: {', '.join(known_names())}")
