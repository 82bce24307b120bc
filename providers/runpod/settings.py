"""RunPod's settings: its API's URL and where its HTTPS proxy publishes a pod's ports, the only way the
fleet reaches a pod's Jobs API. Read as the fleet's other settings (core.settings.CloudSettings)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field

from core.settings import CloudSettings

DEFAULT_API = "https://api.runpod.io"
DEFAULT_PROXY_URL = "https://{pod_id}-{port}.proxy.runpod.net"  # RunPod's HTTPS proxy of a pod's port


class RunPodSettings(CloudSettings):
    """RunPod's knobs: `FLEET_RUNPOD_*`, the settings file's `runpod_*`, and RUNPOD_API_BASE_URL."""

    AS_IS: ClassVar[dict[str, str]] = {"runpod_api_base_url": "RUNPOD_API_BASE_URL"}
    API_URL: ClassVar[str | None] = "runpod_api_base_url"

    runpod_api_base_url: str = Field(
        DEFAULT_API, description="RunPod's API (RUNPOD_API_BASE_URL; a fake's URL in tests)."
    )
    runpod_proxy_url: str = Field(
        DEFAULT_PROXY_URL,
        pattern=r"^https://",
        description="Where RunPod's HTTPS proxy publishes a pod's port ({pod_id}, {port}): the only way the "
        "fleet reaches a pod's Jobs API (a fake's in tests).",
    )
    runpod_proxy_ca_file: Path | None = Field(
        None,
        description="The certificate authorities trusted for RunPod's proxy; unset: the system's (a fake's "
        "own in tests).",
    )
