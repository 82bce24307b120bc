"""The providers a job may name, and what the job's data knows of each cloud, declared in the cloud's own
package.

`ProviderName` is open: `local`, `cloud` (a choice among the rented clouds, made per run) and the name of
every cloud the registry declared: those that rent GPU machines, and `ssh`, the operator's own machines
(`owned`: never among a `cloud:` section's choices unless it names a pool). A cloud's package
(providers/<cloud>/facts.py) declares a `CloudFacts`:
its section model, its names for the GPU types a `cloud:` section may ask for, whether its offers say
where they are, and the names it sets in its nodes' environment (which core.envnames refuses in a job's
`env`). The job's data (jobs/) sits below the providers, so it cannot import them: the registry
(providers.registry) declares every registered cloud's facts here when it is imported, as each process
does when it builds its world. Asking before that is a programming error, raised loudly (`NotDeclared`),
never an empty answer that would pass a job through.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

from core.envnames import Reserved

if TYPE_CHECKING:
    from jobs.sections.base import MachineSection


@dataclass(frozen=True)
class Capability:
    """Whether a provider can do something, and why not when it cannot: data that validation reads, so a
    job that needs it is refused up front with the reason instead of being half-started."""

    supported: bool
    reason: str = ""


class NotDeclared(RuntimeError):
    """The clouds' facts were asked for before the registry declared them (import providers.registry)."""


class ProviderName(str):
    """A provider's name, as a job file's section key names it: `local`, `cloud`, or a declared cloud's. A
    plain string on the wire and in the ledger; validated against the names the fleet knows."""

    __slots__ = ()
    LOCAL: ClassVar[ProviderName]
    CLOUD: ClassVar[ProviderName]

    @property
    def value(self) -> str:
        return str(self)

    @property
    def is_choice(self) -> bool:
        """Whether the section names no one provider: the run's provider is chosen at provision."""
        return self == "cloud"

    @classmethod
    def known(cls, name: str) -> ProviderName:
        """`name` as a ProviderName; ValueError listing the valid ones when the fleet knows no such one."""
        names = provider_names()
        if name not in names:
            raise ValueError(f"unknown provider {name!r}; valid: {', '.join(names)}")
        return cls(name)

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            cls.known, core_schema.str_schema(), serialization=core_schema.to_string_ser_schema()
        )


ProviderName.LOCAL = ProviderName("local")
ProviderName.CLOUD = ProviderName("cloud")


@dataclass(frozen=True)
class CloudFacts:
    """One cloud's facts (see the module's notes)."""

    name: ProviderName
    """The cloud's provider name, as a job file's section key names it."""
    section: type[MachineSection]
    """The model of its section of a job file (providers/<cloud>/section.py); a rented cloud's is a
    RemoteSection."""
    gpu_names: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Each GPU type's normal name (jobs.gpus.GPU_TYPES) -> the cloud's own names for it; a type it does
    not rent is absent. A name the cloud gives to several types (one model in two sizes) stands for each."""
    location: Capability = field(default_factory=lambda: Capability(True))
    """Whether its offers say where the machine is (a `cloud:` section's `avoid` needs it)."""
    node_env: Reserved | None = None
    """The names it sets in its nodes' environment, which a job may not set (core.envnames)."""
    owned: bool = False
    """The operator's own machines (pools reached over SSH), not rented: no offers to choose among."""


def avoided(where: str, avoid: Iterable[str]) -> str | None:
    """The entry of `avoid` that `where` (a place as a cloud reports it: "Sweden, SE", "EU-RO-1, Europe")
    names, or None. Whole names only, case aside: one of its comma-separated parts, or a word of one (a
    country code in a data center's id), so that `RO` avoids EU-RO-1, yet no short code matches inside a
    longer name (`RO` is not in "Europe")."""
    parts = [p.strip().lower() for p in where.split(",") if p.strip()]
    names = set(parts) | {w for p in parts for w in re.split(r"[^0-9a-z]+", p) if w}
    return next((a for a in avoid if a.strip().lower() in names), None)


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


def facts(cloud: str) -> CloudFacts | None:
    """One declared cloud's facts; None for a name that is no declared cloud (`local`, `cloud`)."""
    return declared().get(cloud)


def rented_clouds() -> tuple[ProviderName, ...]:
    """The declared clouds that rent GPU machines, which a `cloud:` section chooses among."""
    return tuple(ProviderName(name) for name, facts in declared().items() if not facts.owned)


def provider_names() -> tuple[ProviderName, ...]:
    """Every name a job's provider section may have: `local`, the declared clouds, `cloud`."""
    return (ProviderName.LOCAL, *(ProviderName(name) for name in declared()), ProviderName.CLOUD)
