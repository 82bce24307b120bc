"""The explicit registry of providers, and what the fleet derives from their declarations.

Importing it declares every cloud's facts (jobs.clouds: section model, GPU names, capabilities, the names
its nodes set), which the job's data reads; each process imports it before it reads a job. From the
providers' declarations it derives the credential names the fleet reads (`CREDENTIAL_NAMES`), the fleet's
settings class (`FleetSettings`: Settings and each cloud's own), and each cloud's settings and API base
URL (`cloud_settings`, `api_urls`). A process gets its providers from its world (providers.world), which
builds them through this registry."""

from __future__ import annotations

import types
from typing import cast

from core import envnames
from core.errors import ConfigError, CredentialsMissing, Problem, ProviderError
from core.secrets import FLEET_CREDENTIALS, Secrets, load_secrets
from core.settings import CloudSettings, Settings
from jobs import clouds
from jobs.sections import ProviderName, rented_clouds
from providers.base import Provider, ProviderContext
from providers.local.provider import LocalProvider
from providers.runpod.provider import RunPodProvider
from providers.ssh.provider import SshProvider
from providers.vastai.provider import VastAIProvider

PROVIDERS: dict[ProviderName, type[Provider]] = {
    cls.name: cls
    for cls in (
        LocalProvider,
        RunPodProvider,
        VastAIProvider,
        SshProvider,
    )
}
"""Every provider of the fleet, by name: a new cloud is its package (providers/<cloud>/) and one line here."""

FACTS = tuple(cls.facts for cls in PROVIDERS.values() if cls.facts is not None)
clouds.declare(FACTS)  # the job's data learns the clouds' GPU names and capabilities
envnames.declare_clouds(tuple(f.node_env for f in FACTS if f.node_env is not None))  # ... and what they set

CREDENTIAL_NAMES: tuple[str, ...] = tuple(
    dict.fromkeys(
        [
            *(n for cls in PROVIDERS.values() for n in (*cls.credential_names, *cls.optional_credentials)),
            *FLEET_CREDENTIALS,
        ]
    )
)
"""Every credential the fleet knows: its providers' and its own."""


def load_fleet_secrets(env: dict[str, str] | None = None) -> Secrets:
    """The fleet's credentials (`CREDENTIAL_NAMES`) from the secrets file and the environment."""
    return load_secrets(env, known=CREDENTIAL_NAMES)


def _fleet_settings() -> type[Settings]:
    """The fleet's settings class: Settings and every registered cloud's own (CloudSettings), so one file
    and one environment set them all, and a key no one declares is an error."""
    clouds = [cls.settings_model for cls in PROVIDERS.values() if cls.settings_model is not None]
    bases = (Settings, *clouds)
    named = types.new_class("FleetSettings", bases, {}, lambda ns: ns.update(__module__=__name__))
    return cast(type[Settings], named)


FleetSettings = _fleet_settings()
"""Settings with every cloud's; providers.world.load_fleet_settings reads them."""


def fleet_runs(settings: Settings) -> tuple[str, ...]:
    """The providers this fleet runs jobs on: FLEET_PROVIDERS, else every registered one."""
    return settings.providers if settings.providers is not None else tuple(PROVIDERS)


def cloud_settings(settings: Settings) -> dict[str, CloudSettings]:
    """Each cloud's own settings as `settings` give them (a plain Settings: the cloud's defaults)."""
    found: dict[str, CloudSettings] = {}
    for name, cls in PROVIDERS.items():
        if cls.settings_model is not None:
            model = cls.settings_model
            given = {k: getattr(settings, k) for k in model.model_fields if hasattr(settings, k)}
            found[name.value] = model.model_validate(given)
    return found


def api_url_setting(cls: type[Provider]) -> str | None:
    """The settings field that holds the provider's API base URL (None: it has no API)."""
    return cls.settings_model.API_URL if cls.settings_model is not None else None


def api_urls(settings: Settings) -> dict[str, str]:
    """Each cloud's API base URL as the settings give it, by provider name (ProviderContext.urls)."""
    return {name: url for name, own in cloud_settings(settings).items() if (url := own.api_url()) is not None}


def provider_name(name: str) -> ProviderName:
    """The ProviderName for `name`, or a ConfigError listing the valid ones."""
    try:
        return ProviderName.known(name)
    except ValueError as exc:
        raise ConfigError("provider", [Problem("provider", str(exc))]) from None


def get_provider(name: str, context: ProviderContext) -> Provider:
    """An instance of the provider called `name` (CredentialsMissing when it needs one it lacks;
    ProviderError for `cloud`, which is a choice among the clouds, made per run: providers.anycloud)."""
    which = provider_name(name)
    if which.is_choice:
        raise ProviderError(f"{which.value} is a choice among {', '.join(rented_clouds())}, not one provider")
    return PROVIDERS[which](context)


def configured_providers(context: ProviderContext) -> list[Provider]:
    """Every registered provider this fleet has credentials for (the others are skipped)."""
    found = []
    for cls in PROVIDERS.values():
        try:
            found.append(cls(context))
        except CredentialsMissing:
            continue
    return found
