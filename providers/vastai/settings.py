"""vast.ai's settings: its API's URL. Read as the fleet's other settings (core.settings.CloudSettings)."""

from __future__ import annotations

import json
from typing import ClassVar

from pydantic import Field, SecretStr

from core.settings import CloudSettings
from jobs.images import SERVER, server_name

DEFAULT_API = "https://console.vast.ai"


class VastAISettings(CloudSettings):
    """vast.ai's knobs: `FLEET_VAST_URL`, the settings file's `vast_url`, and VAST_URL."""

    AS_IS: ClassVar[dict[str, str]] = {"vast_url": "VAST_URL"}
    API_URL: ClassVar[str | None] = "vast_url"

    vast_url: str = Field(DEFAULT_API, description="vast.ai's API (VAST_URL; a fake's in tests).")


REGISTRY_LOGINS = "VAST_REGISTRY_LOGINS"
"""The fleet's docker logins for vast.ai's hosts, a secret (the environment or the secrets file): a mapping
of registry to `user:token` (JSON in the environment), e.g. {"ghcr.io": "acme-bot:ghp_..."}. A private
image's instance is created with its registry's (vast.ai's `image_login`, docker login's arguments): the
host that pulls it sees it, so use a read-only pull token."""


def registry_logins(secret: SecretStr | None) -> dict[str, str]:
    """Each registry's docker login arguments (`-u USER -p TOKEN SERVER`) from REGISTRY_LOGINS (ValueError
    saying what is wrong, never showing the value)."""
    if secret is None or not secret.get_secret_value().strip():
        return {}
    try:
        found = json.loads(secret.get_secret_value())
    except ValueError:
        raise ValueError(f"{REGISTRY_LOGINS} is not a JSON object of registry to user:token") from None
    if not isinstance(found, dict):
        raise ValueError(f"{REGISTRY_LOGINS} must be a mapping of registry to user:token")
    logins = {}
    for server, login in found.items():
        if not SERVER.match(str(server)):
            raise ValueError(f"{REGISTRY_LOGINS}: {server!r} is not a registry's name (a host, e.g. ghcr.io)")
        user, colon, token = str(login).partition(":") if isinstance(login, str) else ("", "", "")
        if not (user and colon and token) or any(c.isspace() for c in str(login)):
            raise ValueError(f"{REGISTRY_LOGINS}: {server}'s login must be user:token, without spaces")
        logins[server_name(str(server))] = f"-u {user} -p {token} {server_name(str(server))}"
    return logins
