"""What every task uses, built once per worker process: its world (settings, secrets, providers: built in
providers.world), Redis, the ledger and the dispatcher."""

from __future__ import annotations

from dataclasses import dataclass

import redis

from broker.app import app
from broker.dispatch import Dispatcher
from core import redisurl
from core.settings import Settings
from providers.base import Provider, ProviderContext
from providers.world import World
from state.ledger import Ledger


@dataclass
class Context:
    """The per-process world of a worker."""

    world: World
    redis: redis.Redis[str]
    ledger: Ledger
    dispatcher: Dispatcher

    @property
    def settings(self) -> Settings:
        return self.world.settings

    @property
    def provider_context(self) -> ProviderContext:
        return self.world.context

    def provider(self, name: str) -> Provider:
        return self.world.provider(name)


_context: Context | None = None


def init(settings: Settings, redis_url: str) -> Context:
    """Build this process's context (the CLI calls it before it starts a worker or beat). The world's
    provider context is made here, not at a task's first use: a seal key that is not one fails the start."""
    global _context
    client = redisurl.connect(redis_url, decode_responses=True)
    world = World.of(settings).sharing(client)
    world.context  # noqa: B018 (made now: a bad FLEET_SEAL_KEY or secrets file stops the worker at its start)
    _context = Context(
        world=world,
        redis=client,
        ledger=Ledger(client, settings.events_maxlen),
        dispatcher=Dispatcher(app, client, settings.stall_after_s),
    )
    return _context


def get() -> Context:
    if _context is None:
        raise RuntimeError("workers.context.init() was not called in this process")
    return _context
