"""The provider sections of a job file (``local:``, ``runpod:``, ``vastai:``, ``cloud:``): one model per
provider, on the shared bases in `base`. They are the job's data, so they live here, below the providers
that act on them; each `Provider` names its section model, and a unit test checks that the two registries
agree (``cloud:`` is a choice among the clouds, made per run: no provider of its own)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from jobs.sections.base import RENTED_CLOUDS, ProviderName, SectionBase
from jobs.sections.cloud import CloudSection
from jobs.sections.local import LocalSection
from jobs.sections.runpod import RunPodSection
from jobs.sections.vastai import VastAISection

ProviderSection = LocalSection | RunPodSection | VastAISection | CloudSection
SECTION_MODELS: Mapping[ProviderName, type[SectionBase]] = MappingProxyType(
    {
        ProviderName.LOCAL: LocalSection,
        ProviderName.RUNPOD: RunPodSection,
        ProviderName.VASTAI: VastAISection,
        ProviderName.CLOUD: CloudSection,
    }
)
"""The section model of each provider."""

__all__ = [
    "RENTED_CLOUDS",
    "SECTION_MODELS",
    "CloudSection",
    "LocalSection",
    "ProviderName",
    "ProviderSection",
    "RunPodSection",
    "SectionBase",
    "VastAISection",
]
