"""Where the notifier's messages go: a webhook, or a channel through the bot's own connection.

Both speak through discord.py, which honours Discord's per-route rate limits and 429 Retry-After itself.
They differ in two things. A bot message can carry a nonce with `enforce_nonce`, so Discord returns the
earlier message instead of posting the same one twice; a webhook cannot, so a crash between a webhook post
and its `sent` mark repeats that one message. And the bot can start a thread from a message: a channel of
the run's own, so its own rate-limit buckets (Discord limits message creates and edits per channel); a
webhook cannot start one in a text channel, so its runs share the channel (and the webhook's buckets).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import threading
from collections.abc import Coroutine
from typing import Any, Final, Literal, Protocol, TypeVar

import aiohttp
import discord
import requests

T = TypeVar("T")
REQUEST_TIMEOUT_S = 120  # discord.py waits out 429s itself; this only bounds a hung connection
NONCE_MAX = 25  # Discord's limit on a message nonce
THREAD_EXISTS = 160004  # Discord's error code: this message has a thread already
# A run's thread is archived after a week without messages (a message reopens it).
ARCHIVE_AFTER_MIN: Final = 10080


class DiscordDown(Exception):
    """Discord (or the way to it) failed a request that discord.py did not retry itself."""


class discord_errors:
    """Turns discord.py's HTTP errors and connection errors into `DiscordDown` (NotFound passes through,
    for the caller that can act on it)."""

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> Literal[False]:
        if isinstance(exc, discord.NotFound):
            return False
        if isinstance(exc, discord.HTTPException | requests.RequestException | aiohttp.ClientError):
            raise DiscordDown(str(exc)) from exc
        if isinstance(exc, TimeoutError):
            raise DiscordDown("no answer from Discord in time") from exc
        return False


def nonce_of(key: str) -> str:
    """A message nonce (at most 25 characters) derived from a stable key such as an event id."""
    return hashlib.sha256(key.encode()).hexdigest()[:NONCE_MAX]


def _in(thread: int | None) -> Any:
    """discord.py's `thread=` argument of a webhook call: the thread, or none (the channel)."""
    return discord.Object(thread) if thread else discord.utils.MISSING


def _file(file: tuple[str, bytes]) -> discord.File:
    """An upload for discord.py (a fresh one each call: discord.py reads it to its end)."""
    return discord.File(io.BytesIO(file[1]), filename=file[0])


class Sink(Protocol):
    """Posts and edits messages in one channel, or in a thread of it (`thread`: its id). Both raise
    `discord.NotFound` for a message that is gone, `DiscordDown` for anything else that failed."""

    secret: str  # what must never appear in a message (the webhook's token); "" when none
    threads: bool  # whether it can start threads (`start_thread`)

    def post(
        self,
        *,
        content: str | None = None,
        embed: discord.Embed | None = None,
        key: str,
        thread: int | None = None,
    ) -> int:
        """Post a message; `key` identifies it, so a sink that can dedupe posts it at most once."""
        ...

    def edit(self, message_id: int, embed: discord.Embed | None, thread: int | None = None) -> None: ...

    def attach(self, message_id: int, file: tuple[str, bytes], thread: int | None = None) -> None:
        """Attach `file`, (name, bytes), to a message posted without one (its only attachment then)."""
        ...

    def start_thread(self, message_id: int, name: str) -> int | None:
        """Start a thread from the channel's message `message_id` (a second start finds the first); the
        thread's id (Discord gives it the message's), or None when the sink may not start threads here."""
        ...


class WebhookSink:
    """A channel webhook, through discord.py's `SyncWebhook` (requests)."""

    threads = False  # a webhook posts into a thread, yet cannot start one in a text channel

    def __init__(self, webhook: discord.SyncWebhook) -> None:
        self.webhook = webhook
        self.secret = webhook.token or ""

    def post(
        self,
        *,
        content: str | None = None,
        embed: discord.Embed | None = None,
        key: str,
        thread: int | None = None,
    ) -> int:
        with discord_errors():
            message = self.webhook.send(
                content or "",
                embed=embed or discord.utils.MISSING,
                wait=True,
                allowed_mentions=discord.AllowedMentions.none(),
                thread=_in(thread),
            )
        return message.id

    def edit(self, message_id: int, embed: discord.Embed | None, thread: int | None = None) -> None:
        with discord_errors():
            self.webhook.edit_message(message_id, embed=embed, thread=_in(thread))

    def attach(self, message_id: int, file: tuple[str, bytes], thread: int | None = None) -> None:
        with discord_errors():
            self.webhook.edit_message(message_id, attachments=[_file(file)], thread=_in(thread))

    def start_thread(self, message_id: int, name: str) -> int | None:
        return None


class BotSink:
    """A channel, as the bot: the client's own HTTP session and rate limiter, driven from another thread
    (the notifier's) onto the client's event loop."""

    threads = True

    def __init__(self, client: discord.Client, channel_id: int, loop: asyncio.AbstractEventLoop) -> None:
        self.client, self.channel_id, self.loop = client, channel_id, loop
        self.secret = ""  # the bot token is never in a message; the notifier scrubs the known secrets

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        with discord_errors():
            return asyncio.run_coroutine_threadsafe(coro, self.loop).result(REQUEST_TIMEOUT_S)

    def post(
        self,
        *,
        content: str | None = None,
        embed: discord.Embed | None = None,
        key: str,
        thread: int | None = None,
    ) -> int:
        channel = self.client.get_partial_messageable(thread or self.channel_id)
        message = self._call(
            channel.send(
                content,
                embed=embed or discord.utils.MISSING,
                nonce=nonce_of(key),
                allowed_mentions=discord.AllowedMentions.none(),
            )
        )
        return message.id

    def edit(self, message_id: int, embed: discord.Embed | None, thread: int | None = None) -> None:
        channel = self.client.get_partial_messageable(thread or self.channel_id)
        self._call(channel.get_partial_message(message_id).edit(embed=embed))

    def attach(self, message_id: int, file: tuple[str, bytes], thread: int | None = None) -> None:
        channel = self.client.get_partial_messageable(thread or self.channel_id)
        self._call(channel.get_partial_message(message_id).edit(attachments=[_file(file)]))

    def start_thread(self, message_id: int, name: str) -> int | None:
        async def start() -> int | None:
            try:
                await self.client.http.start_thread_with_message(
                    self.channel_id, message_id, name=name, auto_archive_duration=ARCHIVE_AFTER_MIN
                )
            except discord.Forbidden:
                return None  # no right to start threads here: the run stays in the channel
            except discord.HTTPException as exc:
                if exc.code != THREAD_EXISTS:
                    raise
            return message_id

        return self._call(start())


class RestClient:
    """A bot client that only speaks REST (no gateway), on an event loop in a thread of its own: what
    `fleet notify` uses to post as the bot. `close()` logs out and ends the thread."""

    def __init__(self, token: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="discord-rest", daemon=True)
        self.thread.start()
        self.client = discord.Client(intents=discord.Intents(guilds=True))
        asyncio.run_coroutine_threadsafe(self.client.login(token), self.loop).result(REQUEST_TIMEOUT_S)

    def sink(self, channel_id: int) -> BotSink:
        return BotSink(self.client, channel_id, self.loop)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.client.close(), self.loop).result(REQUEST_TIMEOUT_S)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
