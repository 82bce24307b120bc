"""vast.ai's settings: its API's URL. Read as the fleet's other settings (core.settings.CloudSettings)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from core.settings import CloudSettings

DEFAULT_API = "https://console.vast.ai"


class VastAISettings(CloudSettings):
    """vast.ai's knobs: `FLEET_VAST_URL`, the settings file's `vast_url`, and VAST_URL."""

    AS_IS: ClassVar[dict[str, str]] = {"vast_url": "VAST_URL"}
    API_URL: ClassVar[str | None] = "vast_url"

    vast_url: str = Field(DEFAULT_API, description="vast.ai's API (VAST_URL; a fake's in tests).")
