"""The explicit registry of providers and their job-section models."""

from __future__ import annotations

from pathlib import Path

from core.errors import ConfigError, CredentialsMissing, Problem
from core.secrets import Secrets, load_secrets
from jobs.sections import ProviderName
from providers.base import Provider, ProviderContext
from providers.local.provider import LocalProvider
from providers.runpod.provider import RunPodProvider
from providers.vastai.provider import VastAIProvider

PROVIDERS: dict[ProviderName, type[Provider]] = {
    ProviderName.LOCAL: LocalProvider,
    ProviderName.RUNPOD: RunPodProvider,
    ProviderName.VASTAI: VastAIProvider,
}


def provider_context(home: Path, urls: dict[str, str], secrets: Secrets | None = None) -> ProviderContext:
    """What providers get: the home, the credentials (masked), the API URLs."""
    found = secrets if secrets is not None else load_secrets()
    return ProviderContext(home=home, credentials=dict(found.values), urls=urls)


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
    """An instance of the provider called `name` (CredentialsMissing when it needs one it lacks)."""
    return PROVIDERS[provider_name(name)](context)


def configured_providers(context: ProviderContext) -> list[Provider]:
    """Every registered provider this fleet has credentials for (the others are skipped)."""
    found = []
    for cls in PROVIDERS.values():
        try:
            found.append(cls(context))
        except CredentialsMissing:
            continue
    return found
