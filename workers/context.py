"""What every task uses, built once per worker process: settings, Redis, the ledger, providers."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis

from broker.app import app
from broker.dispatch import Dispatcher
from broker.ledger import Ledger
from core import redisurl
from core.settings import Settings
from providers.base import Provider, ProviderContext
from providers.registry import get_provider, shared_context


@dataclass
class Context:
    """The per-process world of a worker."""

    settings: Settings
    redis: redis.Redis[str]
    ledger: Ledger
    dispatcher: Dispatcher
    provider_context: ProviderContext
    _providers: dict[str, Provider] = field(default_factory=dict)

    def provider(self, name: str) -> Provider:
        if name not in self._providers:
            self._providers[name] = get_provider(name, self.provider_context)
        return self._providers[name]


_context: Context | None = None


def init(settings: Settings, redis_url: str) -> Context:
    """Build this process's context (the CLI calls it before it starts a worker or beat)."""
    global _context
    client = redisurl.connect(redis_url, decode_responses=True)
    _context = Context(
        settings=settings,
        redis=client,
        ledger=Ledger(client, settings.events_maxlen),
        dispatcher=Dispatcher(app, client, settings.stall_after_s),
        provider_context=shared_context(settings, client),
    )
    return _context


def get() -> Context:
    if _context is None:
        raise RuntimeError("workers.context.init() was not called in this process")
    return _context
