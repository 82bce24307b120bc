"""Acme's provider, against a stub of its API in this process (`API`): offers, instances, the key it
checks."""

from __future__ import annotations

import time
from typing import ClassVar

from providers.acme.facts import ACME
from providers.acme.section import AcmeSection
from providers.acme.settings import AcmeSettings
from pydantic import BaseModel

from core.errors import AuthFailed
from core.settings import CloudSettings
from jobs.clouds import CloudFacts
from jobs.sections import ProviderName, SectionBase
from providers.base import LaunchRequest, NodeInstance, NodeState, ProviderContext
from providers.offers import Candidate, Choice, Priced, choose
from providers.remote import RemoteProvider

KEY = "acme-key-0123"
API: dict[str, dict[str, str]] = {}  # the stub's instances, by id
OFFERS = (("a1", "acme-a100-80", 2.0, 0.9), ("h1", "acme-h100", 4.0, 1.9))


class AcmeRecord(BaseModel):
    id: str
    name: str
    offer: str


class AcmeProvider(RemoteProvider[AcmeSection, AcmeRecord]):
    name: ClassVar[ProviderName] = ACME.name
    section_model: ClassVar[type[SectionBase]] = AcmeSection
    credential_names: ClassVar[tuple[str, ...]] = ("ACME_API_KEY",)
    facts: ClassVar[CloudFacts | None] = ACME
    settings_model: ClassVar[type[CloudSettings] | None] = AcmeSettings
    vendor: ClassVar[str] = "Acme"
    record_model: ClassVar[type[BaseModel]] = AcmeRecord

    def __init__(self, context: ProviderContext) -> None:
        super().__init__(context)
        self.key = context.credential("ACME_API_KEY").get_secret_value()

    def _check(self) -> None:
        if self.key != KEY:
            raise AuthFailed("Acme refused the API key")

    def choose(self, section: AcmeSection) -> Choice:
        self._check()
        found = [
            Candidate(self.name, offer, gpu, 1, on_demand, bid, 16, 64, True)
            for offer, gpu, on_demand, bid in OFFERS
        ]
        return choose(section, section.gpu, found)

    def _create(self, request: LaunchRequest, section: AcmeSection, best: Priced) -> NodeInstance:
        self._check()
        record = AcmeRecord(id=f"i{len(API) + 1}", name=request.name, offer=best.candidate.offer_id)
        API[record.id] = record.model_dump()
        return self._instance(record, probe=False)

    def _list(self) -> list[AcmeRecord]:
        self._check()
        return [AcmeRecord.model_validate(r) for r in API.values()]

    def _name(self, record: AcmeRecord) -> str:
        return record.name

    def _destroy(self, record: AcmeRecord) -> None:
        API.pop(record.id, None)

    def _instance(self, record: AcmeRecord, probe: bool) -> NodeInstance:
        return NodeInstance(record.name, self.name, record.id, NodeState.PENDING, time.time())

    def _jobs_url(self, record: AcmeRecord) -> str | None:
        return None

    def _published(self, record: AcmeRecord, port: int) -> str | None:
        return None

    def _ssh(self, record: AcmeRecord) -> None:
        return None
