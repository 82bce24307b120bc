"""The provider sections of a job file: `local:` and `cloud:` here, on the shared bases in `base`, and
each rented cloud's own, declared in its package (providers/<cloud>/section.py) and handed here by the
registry (jobs.clouds). They are the job's data, so they live below the providers that act on them; each
`Provider` names its section model, and a unit test checks that the two agree (``cloud:`` is a choice
among the clouds, made per run: no provider of its own)."""

from __future__ import annotations

from collections.abc import Mapping

from jobs.clouds import Capability, ProviderName, declared, provider_names, rented_clouds
from jobs.sections.base import MachineSection, RemoteSection, SectionBase
from jobs.sections.cloud import CloudSection
from jobs.sections.local import LocalSection


def section_models() -> Mapping[ProviderName, type[SectionBase]]:
    """The section model of each provider: local's, every declared cloud's, and `cloud:`'s."""
    clouds = {ProviderName(name): facts.section for name, facts in declared().items()}
    return {ProviderName.LOCAL: LocalSection, **clouds, ProviderName.CLOUD: CloudSection}


__all__ = [
    "Capability",
    "CloudSection",
    "LocalSection",
    "MachineSection",
    "ProviderName",
    "RemoteSection",
    "SectionBase",
    "provider_names",
    "rented_clouds",
    "section_models",
]
