"""The explicit registry of providers and their job-section models."""

from __future__ import annotations

from fleet.errors import ConfigError, CredentialsMissing, Problem
from providers.base import Provider, ProviderContext, ProviderName
from providers.local.provider import LocalProvider
from providers.runpod.provider import RunPodProvider

PROVIDERS: dict[ProviderName, type[Provider]] = {
    ProviderName.LOCAL: LocalProvider,
    ProviderName.RUNPOD: RunPodProvider,
}


def provider_name(name: str) -> ProviderName:
    """The ProviderName for `name`, or a ConfigError listing the valid ones."""
    try:
        return ProviderName(name)
    except ValueError:
        valid = ", ".join(p.value for p in ProviderName)
        raise ConfigError(
            "provider", [Problem("provider", f"unknown provider {name!r}; valid: {valid}")]
        ) from None


def get_provider(name: str, context: ProviderContext) -> Provider:
    """An instance of the provider called `name`."""
    key = provider_name(name)
    cls = PROVIDERS.get(key)
    if cls is None:
        ready = ", ".join(p.value for p in PROVIDERS)
        raise ConfigError(
            "provider",
            [Problem("provider", f"provider {key.value!r} is not available yet; available: {ready}")],
        )
    return cls(context)


def configured_providers(context: ProviderContext) -> list[Provider]:
    """Every registered provider this fleet has credentials for (the others are skipped)."""
    found = []
    for cls in PROVIDERS.values():
        try:
            found.append(cls(context))
        except CredentialsMissing:
            continue
    return found
