"""The explicit registry of providers, and what the fleet derives from their declarations: the credential
names it reads (`CREDENTIAL_NAMES`) and the API base URLs it hands them (`api_urls`). A process gets its
providers from its world (providers.world), which builds them through this registry."""

from __future__ import annotations

from core.errors import ConfigError, CredentialsMissing, Problem, ProviderError
from core.secrets import FLEET_CREDENTIALS, Secrets, load_secrets
from core.settings import AS_IS, Settings
from jobs.sections import RENTED_CLOUDS, ProviderName
from providers.base import Provider, ProviderContext
from providers.local.provider import LocalProvider
from providers.runpod.provider import RunPodProvider
from providers.vastai.provider import VastAIProvider

PROVIDERS: dict[ProviderName, type[Provider]] = {
    ProviderName.LOCAL: LocalProvider,
    ProviderName.RUNPOD: RunPodProvider,
    ProviderName.VASTAI: VastAIProvider,
}

CREDENTIAL_NAMES: tuple[str, ...] = tuple(
    dict.fromkeys([*(n for cls in PROVIDERS.values() for n in cls.credential_names), *FLEET_CREDENTIALS])
)
"""Every credential the fleet knows: its providers' and its own."""


def load_fleet_secrets(env: dict[str, str] | None = None) -> Secrets:
    """The fleet's credentials (`CREDENTIAL_NAMES`) from the secrets file and the environment."""
    return load_secrets(env, known=CREDENTIAL_NAMES)


def api_url_setting(cls: type[Provider]) -> str | None:
    """The Settings field that holds the provider's API base URL: the one read from its `api_url_env`
    (None: the provider has no API URL)."""
    if cls.api_url_env is None:
        return None
    fields = [field for field, env in AS_IS.items() if env == cls.api_url_env]
    if not fields:
        raise LookupError(
            f"{cls.__name__}.api_url_env {cls.api_url_env} is no setting's (core.settings.AS_IS)"
        )
    return fields[0]


def api_urls(settings: Settings) -> dict[str, str]:
    """Each cloud's API base URL as the settings give it, by provider name (ProviderContext.urls)."""
    urls = {}
    for name, cls in PROVIDERS.items():
        field = api_url_setting(cls)
        if field is not None:
            urls[name.value] = str(getattr(settings, field))
    return urls


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
    """An instance of the provider called `name` (CredentialsMissing when it needs one it lacks;
    ProviderError for `cloud`, which is a choice among the clouds, made per run: providers.anycloud)."""
    which = provider_name(name)
    if which.is_choice:
        raise ProviderError(f"{which.value} is a choice among {', '.join(RENTED_CLOUDS)}, not one provider")
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
