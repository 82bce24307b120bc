"""The fleet's world, composed in one place: its settings, its secrets and the providers built from them.

Every process gets its world here: the CLI and the bot through `service.runs.Fleet` (which adds Redis and
the ledger), a worker through `workers.context.init`, a command with no Redis (`fleet validate`, `fleet
offers`) from `World.of(settings)`. Nothing else reads the secrets, makes a `ProviderContext` or a
provider: tests/unit/test_world.py fails when code outside this module does.

A world reads its secrets once, on first use (a command that never needs one never reads the file), and
keeps them, as it keeps its settings: a worker, the bot and the notifier see the credentials they started
with, all alike, until they are restarted. Its providers are made once each, on first use.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import redis

from core.errors import ConfigError, Problem
from core.secrets import Secrets
from core.settings import Settings, config_dir, load_settings, settings_file
from providers.base import Provider, ProviderContext
from providers.listing import ListingCache, RedisListings
from providers.registry import (
    PROVIDERS,
    FleetSettings,
    api_urls,
    cloud_settings,
    configured_providers,
    fleet_runs,
    get_provider,
    load_fleet_secrets,
)
from providers.sealed import SEAL_KEY, FileStore, SealedStore, seal_key


@dataclass
class World:
    """Settings, secrets and providers of one process; with `client` (the fleet's Redis), providers that
    share the instance lists and the nodes' sealed tokens with every other process of the fleet."""

    settings: Settings
    known_secrets: Secrets | None = None  # the secrets given, or read on first use (None: not yet)
    client: redis.Redis[str] | None = None  # the fleet's Redis, when this process has it
    env: dict[str, str] | None = None  # where the secrets are read from (None: os.environ)
    _context: ProviderContext | None = field(default=None, init=False, repr=False)
    _providers: dict[str, Provider] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def load(cls, env: dict[str, str] | None = None) -> World:
        """The world of this environment (os.environ unless `env`): its settings, read now (ConfigError: they
        are not valid), and its secrets, read on first use."""
        return cls(load_fleet_settings(env), env=env)

    @classmethod
    def of(cls, settings: Settings, secrets: Secrets | None = None) -> World:
        """The world of `settings`, with `secrets` (else the fleet's, read on first use)."""
        return cls(settings, secrets)

    def sharing(self, client: redis.Redis[str]) -> World:
        """This world with providers that share lists and the nodes' tokens through the fleet's Redis."""
        return World(self.settings, self.known_secrets, client, self.env)

    @property
    def secrets(self) -> Secrets:
        """The fleet's credentials (masked), read once (ConfigError: the secrets file is not valid)."""
        if self.known_secrets is None:
            self.known_secrets = load_fleet_secrets(self.env)
        return self.known_secrets

    @property
    def context(self) -> ProviderContext:
        """What this world's providers get (ConfigError: FLEET_SEAL_KEY is not a seal key)."""
        if self._context is None:
            self._context = _context(self.settings, self.secrets, self.client)
        return self._context

    def provider(self, name: str) -> Provider:
        """The provider called `name`, made once (CredentialsMissing: it needs a credential the fleet lacks;
        ConfigError: no such provider; ProviderError: `cloud`, a choice made per run)."""
        if name not in self._providers:
            self._providers[name] = get_provider(name, self.context)
        return self._providers[name]

    @property
    def runs(self) -> tuple[str, ...]:
        """The providers this fleet runs jobs on (FLEET_PROVIDERS, else all it has)."""
        return fleet_runs(self.settings)

    def configured(self) -> list[Provider]:
        """Every registered provider this fleet has credentials for."""
        return configured_providers(self.context)


def load_fleet_settings(env: dict[str, str] | None = None) -> Settings:
    """The fleet's settings (FleetSettings) from the settings file and the environment (ConfigError: not
    valid, or FLEET_PROVIDERS names a provider the fleet does not have)."""
    settings = load_settings(env, FleetSettings)
    unknown = [name for name in settings.providers or () if name not in PROVIDERS]
    if unknown:
        valid = ", ".join(PROVIDERS)
        message = f"unknown provider {unknown[0]!r}; valid: {valid}"
        raise ConfigError("settings", [Problem("providers", message)])
    return settings


def _context(settings: Settings, secrets: Secrets, client: redis.Redis[str] | None) -> ProviderContext:
    """What providers get: the fleet's home, the credentials, the API URLs, the fleet's SSH public key; with
    Redis, the shared instance lists (providers.listing), the nodes' tokens sealed in Redis
    (providers.sealed), so that any worker, on any machine, can reach a node another made, and Redis itself
    (the pool machines' claims)."""
    context = ProviderContext(
        home=settings.home,
        credentials=dict(secrets.values),
        urls=api_urls(settings),
        node_python=settings.node_python,
        axolotl_python=settings.axolotl_python,
        default_image=settings.node_image,
        axolotl_image=settings.axolotl_image,
        api_timeouts=settings.provider_api_timeouts,
        clouds=cloud_settings(settings),
        ssh_public_key=settings.ssh_public_key.line if settings.ssh_public_key is not None else None,
        local_sandbox=settings.local_sandbox,
        local_node_uid=settings.local_node_uid,
        private_paths=(settings.home, settings.runs_dir, secrets.file, settings_file(), config_dir()),
        runs_dir=settings.runs_dir,
    )
    if client is None:
        return context
    configured = context.credentials.get(SEAL_KEY)
    key, source = seal_key(configured.get_secret_value() if configured else None, settings.home)
    local = FileStore(settings.home / "secrets" / "nodes")
    context = replace(context, node_secrets=SealedStore(client, key, local, source), client=client)
    if settings.provider_list_max_age_s <= 0:
        return context
    return replace(context, listings=ListingCache(RedisListings(client), settings.provider_list_max_age_s))
