"""RunPod's settings: its API's URL and where its HTTPS proxy publishes a pod's ports, the only way the
fleet reaches a pod's Jobs API. Read as the fleet's other settings (core.settings.CloudSettings)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator

from core.settings import CloudSettings
from jobs.images import SERVER, server_name
from providers.runpod.client import DEFAULT_REST_URL

DEFAULT_API = "https://api.runpod.io"
DEFAULT_PROXY_URL = "https://{pod_id}-{port}.proxy.runpod.net"  # RunPod's HTTPS proxy of a pod's port
_AUTH_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # the id RunPod gives a saved container registry auth


class RunPodSettings(CloudSettings):
    """RunPod's knobs: `FLEET_RUNPOD_*`, the settings file's `runpod_*`, and RUNPOD_API_BASE_URL."""

    AS_IS: ClassVar[dict[str, str]] = {"runpod_api_base_url": "RUNPOD_API_BASE_URL"}
    API_URL: ClassVar[str | None] = "runpod_api_base_url"

    runpod_api_base_url: str = Field(
        DEFAULT_API, description="RunPod's API (RUNPOD_API_BASE_URL; a fake's URL in tests)."
    )
    runpod_rest_url: str = Field(
        DEFAULT_REST_URL,
        description="RunPod's REST API, where the fleet makes, lists and deletes network volumes "
        "(`network_volume:`, `fleet volumes`; a fake's in tests).",
    )
    runpod_max_volume_gb: int = Field(
        500,
        ge=0,
        le=4000,
        description="The largest network volume a job may have the fleet make (`network_volume: "
        "size_in_gb`): a volume bills by the month, outside any run's cap; 0: jobs make none.",
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
    runpod_registry_auths: dict[str, str] = Field(
        default_factory=dict,
        description="The container registry auths of the RunPod account, by registry (a mapping, JSON in "
        'the environment: {"ghcr.io": "<auth id>"}): a pod of a private image (`private_image: true`) is '
        "created with the auth of its image's registry. Make one on RunPod (Settings > Container Registry "
        "Auth, or the API's saveRegistryAuth) with a read-only pull token: the password stays on RunPod.",
    )

    @field_validator("runpod_registry_auths", mode="before")
    @classmethod
    def _auths(cls, value: Any) -> Any:
        """From the environment: JSON. Each key a registry's name (docker.io for Docker Hub), each value an
        auth's id."""
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except ValueError as exc:
                raise ValueError(f"must be a JSON object of registry to auth id ({exc})") from None
        if not isinstance(value, dict):
            return value
        for server, auth in value.items():
            if not SERVER.match(str(server)):
                raise ValueError(f"{server!r} is not a registry's name (a host, e.g. ghcr.io)")
            if not isinstance(auth, str) or not _AUTH_ID.match(auth):
                raise ValueError(f"{server}: {auth!r} is not a RunPod container registry auth's id")
        return {server_name(str(k)): v for k, v in value.items()}
