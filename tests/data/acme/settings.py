"""Acme's settings: its API's URL."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from core.settings import CloudSettings


class AcmeSettings(CloudSettings):
    AS_IS: ClassVar[dict[str, str]] = {"acme_url": "ACME_URL"}
    API_URL: ClassVar[str | None] = "acme_url"

    acme_url: str = Field("https://api.acme.invalid", description="Acme's API (ACME_URL).")
