"""The provider sections of a job file (``local:``, ``runpod:``, ``vastai:``): one model per provider, on the
shared bases in `base`. They are the job's data, so they live here, below the providers that act on them;
each `Provider` names its section model, and a unit test checks that the two registries agree."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from jobs.sections.base import ProviderName, SectionBase
from jobs.sections.local import LocalSection
from jobs.sections.runpod import RunPodSection
from jobs.sections.vastai import VastAISection

ProviderSection = LocalSection | RunPodSection | VastAISection
SECTION_MODELS: Mapping[ProviderName, type[SectionBase]] = MappingProxyType(
    {ProviderName.LOCAL: LocalSection, ProviderName.RUNPOD: RunPodSection, ProviderName.VASTAI: VastAISection}
)
"""The section model of each provider."""

__all__ = [
    "SECTION_MODELS",
    "LocalSection",
    "ProviderName",
    "ProviderSection",
    "RunPodSection",
    "SectionBase",
    "VastAISection",
]
