"""GPU types in one normal form, with each cloud's own names for them: what a `cloud:` section asks for.

A job that may land on any cloud cannot name a GPU the way one vendor does (RunPod's "NVIDIA A100 80GB
PCIe", vast.ai's "A100 PCIE" with 80 GB): it names the type (`A100-80GB`, `H100`, `RTX-A6000`, `L40S`), and
each cloud's offers are matched against the names that vendor uses for it, plus the memory that tells one
size of a model from another where the vendor's name does not (vast.ai's A100s). The names a user writes are
read loosely (`a100 80gb`, `NVIDIA RTX A6000`, `RTX_A6000`, `4090`); one that is none of these is an error
that lists the known ones.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from jobs.sections.base import ProviderName


@dataclass(frozen=True)
class GpuType:
    """One GPU type: its normal name, the memory of one GPU (GB), and each cloud's names for it."""

    name: str
    memory_gb: int
    runpod: tuple[str, ...] = ()
    vastai: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()

    def vendor_names(self, cloud: ProviderName) -> tuple[str, ...]:
        """The cloud's own names for this type (empty: that cloud does not rent it)."""
        if cloud is ProviderName.RUNPOD:
            return self.runpod
        if cloud is ProviderName.VASTAI:
            return self.vastai
        return ()

    @property
    def memory_range(self) -> tuple[float, float]:
        """Per-GPU memory that counts as this type on a cloud whose name covers several sizes (GB)."""
        return self.memory_gb * 0.95, self.memory_gb * 1.05


_TYPES = (
    GpuType("B200", 180, ("NVIDIA B200",), ("B200",)),
    GpuType("H200", 141, ("NVIDIA H200",), ("H200", "H200 NVL")),
    GpuType("H100-SXM", 80, ("NVIDIA H100 80GB HBM3",), ("H100 SXM",), ("H100-80GB-HBM3",)),
    GpuType("H100-PCIE", 80, ("NVIDIA H100 PCIe",), ("H100 PCIE",)),
    GpuType("H100-NVL", 94, ("NVIDIA H100 NVL",), ("H100 NVL",)),
    GpuType("A100-80GB", 80, ("NVIDIA A100 80GB PCIe", "NVIDIA A100-SXM4-80GB"), ("A100 PCIE", "A100 SXM4")),
    GpuType("A100-40GB", 40, (), ("A100 PCIE", "A100 SXM4")),
    GpuType("L40S", 48, ("NVIDIA L40S",), ("L40S",)),
    GpuType("L40", 48, ("NVIDIA L40",), ("L40",)),
    GpuType("A40", 48, ("NVIDIA A40",), ("A40",)),
    GpuType("L4", 24, ("NVIDIA L4",), ("L4",)),
    GpuType("RTX-6000-ADA", 48, ("NVIDIA RTX 6000 Ada Generation",), ("RTX 6000Ada",), ("RTX-6000-ADA-GEN",)),
    GpuType("RTX-A6000", 48, ("NVIDIA RTX A6000",), ("RTX A6000",)),
    GpuType("RTX-A5000", 24, ("NVIDIA RTX A5000",), ("RTX A5000",)),
    GpuType("RTX-A4000", 16, ("NVIDIA RTX A4000",), ("RTX A4000",)),
    GpuType("RTX-5090", 32, ("NVIDIA GeForce RTX 5090",), ("RTX 5090",), ("5090",)),
    GpuType("RTX-4090", 24, ("NVIDIA GeForce RTX 4090",), ("RTX 4090",), ("4090",)),
    GpuType("RTX-3090", 24, ("NVIDIA GeForce RTX 3090",), ("RTX 3090",), ("3090",)),
)  # fmt: skip

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


def _lookup() -> dict[str, tuple[str, ...]]:
    found: dict[str, tuple[str, ...]] = {squash(group): members for group, members in GROUPS.items()}
    for t in _TYPES:
        for said in (t.name, *t.aliases, *t.runpod):  # RunPod's names are unambiguous; vast.ai's are not
            found.setdefault(squash(said), (t.name,))
        for said in t.vastai:
            found.setdefault(squash(said), tuple(u.name for u in _TYPES if said in u.vastai))
    return found


_BY_SQUASHED = MappingProxyType(_lookup())


def known_names() -> list[str]:
    """The names to offer a user who wrote an unknown one: the types and the groups."""
    return [*GPU_TYPES, *GROUPS]


def resolve(name: str) -> tuple[str, ...]:
    """The GPU types `name` stands for, by normal name; ValueError naming the known ones when none."""
    found = _BY_SQUASHED.get(squash(name))
    if found is not None:
        return found
    close = difflib.get_close_matches(squash(name), [squash(n) for n in known_names()], n=1, cutoff=0.6)
    hint = f" (did you mean {next(n for n in known_names() if squash(n) == close[0])}?)" if close else ""
    raise ValueError(f"unknown GPU type {name!r}{hint}; known: {', '.join(known_names())}")
