"""`fleet bot`: the Discord bot. Slash commands (bot/commands.py) plus the notifier, posting as the bot.

The client needs no privileged intents: interactions arrive whatever the intents. `setup_hook` (run on
login, before the gateway connects) learns the gateway's URL (GET /gateway/bot), registers the commands (in
one server when FLEET_DISCORD_GUILD_ID is set: instant; else globally) and starts the notifier in a thread
of its own, which posts through the client's event loop and rate limiter. While its gateway session is up
the bot marks itself alive in Redis for `fleet health bot`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import socket
import threading

import discord
import discord.gateway
import discord.http
import redis
import yarl

from bot.commands import FleetTree
from bot.notifier import Notifier, secret_values
from bot.sinks import BotSink
from core.errors import ConfigError, Problem
from core.secrets import Secrets
from service.runs import Fleet
from state.keys import alive_key

log = logging.getLogger(__name__)

MARK_S = 5.0  # how often the bot says whether its gateway session is up (`fleet health bot` reads it)


class FleetBot(discord.Client):
    """The bot: the fleet's commands, and (with a channel configured) its notifier."""

    def __init__(self, fleet: Fleet, stop_on_sigterm: bool = False) -> None:
        super().__init__(intents=discord.Intents(guilds=True))  # no privileged intent
        self.fleet, self.secrets = fleet, fleet.world.secrets
        self.tree = FleetTree(self, fleet, secret_values(self.secrets))
        self.stop_notifier = threading.Event()
        self.notifier_thread: threading.Thread | None = None
        self.marker: asyncio.Task[None] | None = None
        self.stop_on_sigterm = stop_on_sigterm

    async def setup_hook(self) -> None:
        # Where the gateway is, as Discord asks bots to learn it (discord.py would go to its default).
        _shards, url, _limit = await self.http.get_bot_gateway()
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(url)
        self.marker = asyncio.create_task(self._mark_alive())
        if self.stop_on_sigterm:  # docker stop, systemd: a clean close (the mark and the notifier with it)
            self.loop.add_signal_handler(signal.SIGTERM, lambda: self.loop.create_task(self.close()))
        settings = self.fleet.settings
        guild = discord.Object(settings.discord_guild_id) if settings.discord_guild_id else None
        if guild is not None:
            self.tree.copy_global_to(guild=guild)
        synced = await self.tree.sync(guild=guild)
        log.info("registered %d slash commands (%s)", len(synced), "guild" if guild else "global")
        if settings.discord_channel_id is not None:
            sink = BotSink(self, settings.discord_channel_id, self.loop)
            notifier = Notifier(self.fleet.redis, sink, secret_values(self.secrets))
            self.notifier_thread = threading.Thread(
                target=notifier.run_forever, args=(self.stop_notifier,), name="notifier", daemon=True
            )
            self.notifier_thread.start()

    def gateway_up(self) -> bool:
        """Whether the bot's gateway session is up: ready, its socket open, its heartbeat answered."""
        ws = self.ws
        return self.is_ready() and ws is not None and ws.open and math.isfinite(ws.latency)

    async def _mark_alive(self) -> None:
        """Every MARK_S, mark the bot alive in Redis while its gateway session is up, and take the mark
        away while it is not: `fleet health bot` (compose's healthcheck) reads it."""
        key = alive_key("bot", socket.gethostname())
        while not self.is_closed():
            up = self.gateway_up()
            with contextlib.suppress(redis.RedisError):
                if up:
                    await asyncio.to_thread(self.fleet.redis.set, key, "1", ex=int(MARK_S * 3))
                else:
                    await asyncio.to_thread(self.fleet.redis.delete, key)
            await asyncio.sleep(MARK_S)

    async def close(self) -> None:
        if self.marker is not None:
            self.marker.cancel()
        with contextlib.suppress(redis.RedisError):
            self.fleet.redis.delete(alive_key("bot", socket.gethostname()))
        self.stop_notifier.set()
        if self.notifier_thread is not None:
            # The notifier may be waiting on this loop; let it finish its request before the loop stops.
            await self.loop.run_in_executor(None, self.notifier_thread.join, 30)
        await super().close()


def bot_token(secrets: Secrets) -> str:
    """The bot's token (FLEET_DISCORD_BOT_TOKEN, from the environment or the secrets file)."""
    token = secrets.get("FLEET_DISCORD_BOT_TOKEN")
    if token is None:
        problem = Problem("FLEET_DISCORD_BOT_TOKEN", "not set (the environment or the fleet's secrets file)")
        raise ConfigError("settings", [problem])
    return token.get_secret_value()


def run_bot(fleet: Fleet) -> None:
    """Connect to Discord and serve until Ctrl-C or SIGTERM. Points discord.py at `discord_api_base`."""
    token = bot_token(fleet.world.secrets)
    discord.http.Route.BASE = fleet.settings.discord_api_base.rstrip("/")
    discord.utils.setup_logging()  # INFO to stderr for discord.py and the fleet's own loggers alike
    FleetBot(fleet, stop_on_sigterm=True).run(token, log_handler=None)
