"""What the job's data knows of each rented cloud, declared in the cloud's own package.

A cloud's package (providers/<cloud>/facts.py) declares a `CloudFacts`: its names for the GPU types a
`cloud:` section may ask for, whether its offers say where they are, and the names it sets in its nodes'
environment (which core.envnames refuses in a job's `env`). The job's data (jobs/) sits below
the providers, so it cannot import them: the registry (providers.registry) declares every registered
cloud's facts here when it is imported, as each process does when it builds its world. Asking before that
is a programming error, raised loudly (`NotDeclared`), never an empty answer that would pass a job through.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from core.envnames import Reserved
from jobs.sections.base import Capability


@dataclass(frozen=True)
class CloudFacts:
    """One cloud's facts (see the module's notes)."""

    name: str
    """The cloud's provider name, as a job file's section key names it."""
    gpu_names: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Each GPU type's normal name (jobs.gpus.GPU_TYPES) -> the cloud's own names for it; a type it does
    not rent is absent. A name the cloud gives to several types (one model in two sizes) stands for each."""
    location: Capability = field(default_factory=lambda: Capability(True))
    """Whether its offers say where the machine is (a `cloud:` section's `avoid` needs it)."""
    node_env: Reserved | None = None
    """The names it sets in its nodes' environment, which a job may not set (core.envnames)."""


class NotDeclared(RuntimeError):
    """The clouds' facts were asked for before the registry declared them (import providers.registry)."""


_DECLARED: dict[str, CloudFacts] | None = None


def declare(clouds: Iterable[CloudFacts]) -> None:
    """Declare the registered clouds' facts (the registry's, once per process; again: replaced)."""
    global _DECLARED
    _DECLARED = {facts.name: facts for facts in clouds}


def declared() -> Mapping[str, CloudFacts]:
    """Every declared cloud's facts, by name (NotDeclared: the registry has not declared them)."""
    if _DECLARED is None:
        raise NotDeclared("no cloud is declared yet: import providers.registry before reading a job")
    return MappingProxyType(_DECLARED)


def facts(cloud: str) -> CloudFacts:
    """One cloud's facts; a name no cloud declared has none (an empty CloudFacts)."""
    return declared().get(cloud) or CloudFacts(cloud)
