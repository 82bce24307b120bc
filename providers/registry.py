"""The explicit registry of providers, and what the fleet derives from their declarations: the credential
names it reads (`CREDENTIAL_NAMES`) and the API base URLs it hands them (`api_urls`)."""

from __future__ import annotations

from dataclasses import replace

import redis

from core.errors import ConfigError, CredentialsMissing, Problem, ProviderError
from core.secrets import FLEET_CREDENTIALS, Secrets, load_secrets
from core.settings import AS_IS, Settings, config_dir, settings_file
from jobs.sections import RENTED_CLOUDS, ProviderName
from providers.base import Provider, ProviderContext
from providers.listing import ListingCache, RedisListings
from providers.local.provider import LocalProvider
from providers.runpod.provider import RunPodProvider
from providers.sealed import SEAL_KEY, FileStore, SealedStore, seal_key
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


def provider_context(settings: Settings, secrets: Secrets | None = None) -> ProviderContext:
    """What providers get: the fleet's home, the credentials (masked; the fleet's secrets unless given), the
    API URLs, the fleet's SSH public key."""
    found = secrets if secrets is not None else load_fleet_secrets()
    return ProviderContext(
        home=settings.home,
        credentials=dict(found.values),
        urls=api_urls(settings),
        node_python=settings.node_python,
        axolotl_python=settings.axolotl_python,
        default_image=settings.node_image,
        axolotl_image=settings.axolotl_image,
        api_timeouts=settings.provider_api_timeouts,
        runpod_proxy_url=settings.runpod_proxy_url,
        runpod_proxy_ca_file=settings.runpod_proxy_ca_file,
        ssh_public_key=settings.ssh_public_key.line if settings.ssh_public_key is not None else None,
        local_sandbox=settings.local_sandbox,
        local_node_uid=settings.local_node_uid,
        private_paths=(settings.home, settings.runs_dir, found.file, settings_file(), config_dir()),
        runs_dir=settings.runs_dir,
    )


def shared_context(
    settings: Settings, client: redis.Redis[str], secrets: Secrets | None = None
) -> ProviderContext:
    """The providers' context of a process that has the fleet's Redis: the instance lists every process
    shares (providers.listing) and the nodes' tokens sealed in Redis (providers.sealed), so that any worker,
    on any machine, can reach a node another made. ConfigError when FLEET_SEAL_KEY is not a seal key."""
    context = provider_context(settings, secrets)
    configured = context.credentials.get(SEAL_KEY)
    key, source = seal_key(configured.get_secret_value() if configured else None, settings.home)
    local = FileStore(settings.home / "secrets" / "nodes")
    context = replace(context, node_secrets=SealedStore(client, key, local, source))
    if settings.provider_list_max_age_s <= 0:
        return context
    return replace(context, listings=ListingCache(RedisListings(client), settings.provider_list_max_age_s))


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
