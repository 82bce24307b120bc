"""The Discord notifier: the fleet's event stream, relayed into one channel (by webhook or as the bot).

It reads `tf:events` through its own consumer group (`notifier`), so it sees every event whatever else
reads the stream. Per run it keeps ONE status message, edited in place; a few events (a failure, a
result, a W&B link, an instance kept, a reaper kill) also get a message of their own. The posts and the
edits are two Discord routes, each with its own limits: a batch goes out in two lanes side by side, one
request at a time in each, so a 429 waited out on one route delays only that lane.

Delivery is at least once. A batch is handled, then acked; an error from Discord stops the batch without
an ack, and the entries come again (pending first). Status edits render the run as the ledger holds it
now, so repeating one is harmless. A separate message is posted, THEN marked sent under
`tf:notify:sent:<event id>`, then acked; a repeat whose key exists is skipped. A crash between a post and
its `sent` key: as the bot, the post carries a nonce derived from the event id and Discord answers the
repeat with the first message; through a webhook (no nonce there) that one message is posted again.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import discord
import discord.http
import redis
import requests

from bot.render import CONTENT_MAX, SEPARATE, Scrubber, fit_embed, separate_message, status_embed, truncate
from bot.sinks import DiscordDown, Sink, WebhookSink
from broker.constants import NOTIFIER_GROUP, notify_sent_key, notify_status_key
from broker.cost import run_cost
from broker.events import EventConsumer
from broker.ledger import Ledger
from broker.payloads import Event, WandbRun
from core.errors import ConfigError, NotFound, Problem
from core.secrets import Secrets
from core.settings import Settings

log = logging.getLogger(__name__)

SENT_TTL_S = 7 * 24 * 3600
_WEBHOOK_PATH = re.compile(r"/api(?:/v\d+)?/webhooks/(\d+)/([^/?#]+)")


def webhook_parts(url: str) -> tuple[int, str]:
    """(id, token) from a webhook URL. Parsed here: discord.py's `from_url` accepts discord.com hosts only."""
    found = _WEBHOOK_PATH.search(url)
    if found is None:
        raise ConfigError(
            "settings", [Problem("discord_webhook_url", "expected .../api/webhooks/<id>/<token>")]
        )
    return int(found.group(1)), found.group(2)


def secret_values(secrets: Secrets) -> list[str]:
    """Every known credential's value: what the notifier scrubs from whatever it posts."""
    return [value.get_secret_value() for value in secrets.values.values()]


class Notifier:
    """Relays events to a Discord channel. `process_once` handles one batch; `run_forever` loops."""

    def __init__(
        self,
        client: redis.Redis[str],
        sink: Sink,
        secret_values: Iterable[str] = (),
        consumer: str | None = None,
        block_ms: int = 500,
        batch: int = 100,
        backoff_s: float = 2.0,
    ) -> None:
        self.client = client
        self.ledger = Ledger(client)
        self.sink = sink
        self.consumer = EventConsumer(client, NOTIFIER_GROUP, consumer or f"{socket.gethostname()}-notifier")
        self.scrub = Scrubber([*secret_values, sink.secret])
        self.block_ms, self.batch, self.backoff_s = block_ms, batch, backoff_s
        self.ack_enabled = True  # tests turn it off to act out a crash between posting and acking
        self.last_error: str | None = None

    @classmethod
    def from_settings(
        cls, settings: Settings, client: redis.Redis[str], secrets: Secrets, session: requests.Session
    ) -> Notifier:
        """A notifier for the configured webhook. Points discord.py (process-wide) at `discord_api_base`.
        (As the bot, build a `BotSink` and the notifier directly.)"""
        if not settings.discord_webhook_url:
            raise ConfigError(
                "settings", [Problem("discord_webhook_url", "FLEET_DISCORD_WEBHOOK_URL is not set")]
            )
        hook_id, token = webhook_parts(settings.discord_webhook_url)
        discord.http.Route.BASE = settings.discord_api_base.rstrip("/")
        webhook = discord.SyncWebhook.partial(hook_id, token, session=session)
        return cls(client, WebhookSink(webhook), secret_values(secrets))

    # -- the loop ----------------------------------------------------------------------------------
    def run_forever(self, stop: threading.Event) -> None:
        """Handle batches until `stop` is set; after a failed batch wait `backoff_s` (the entries stay)."""
        while not stop.is_set():
            self.process_once()
            if self.last_error is not None:
                stop.wait(self.backoff_s)

    def process_once(self) -> int:
        """Read one batch (blocking up to `block_ms`), relay it, ack it; returns how many events were
        handled. When Discord fails, nothing of the batch is acked and 0 is returned: the entries come
        again on the next call, and `last_error` says why (`run_forever` then backs off)."""
        self.last_error = None
        entries = self.consumer.read(count=self.batch, block_ms=self.block_ms)
        if not entries:
            return 0
        try:
            self._handle([event for _sid, event in entries])
        except DiscordDown as exc:
            log.warning("discord refused a batch of %d events (%s); it will be retried", len(entries), exc)
            self.last_error = str(exc)
            self.consumer.redeliver()
            return 0
        if self.ack_enabled:
            self.consumer.ack(*(sid for sid, _event in entries))
        return len(entries)

    # -- one batch ---------------------------------------------------------------------------------
    def _handle(self, events: list[Event]) -> None:
        """A batch in two lanes, one per Discord route, side by side: the posts (a new run's status
        message, then the messages of their own, in event order) and the edits (each run's status message,
        once however many of its events came). A 429 that discord.py waits out on one route holds up only
        its lane; within a lane one request at a time, so a route's limit is never crossed. The batch fails
        (DiscordDown) when either lane did."""
        wandb_urls: dict[str, str] = {}
        runs: list[str] = []
        for event in events:
            if event.run_id and event.run_id not in runs:
                runs.append(event.run_id)
            if isinstance(event.data, WandbRun) and event.run_id and event.data.url:
                wandb_urls[event.run_id] = event.data.url
        posts: list[Callable[[], None]] = []
        edits: list[Callable[[], None]] = []
        for run_id in runs:
            lane = edits if self.client.exists(notify_status_key(run_id)) else posts
            lane.append(partial(self._update_status, run_id, wandb_urls.get(run_id)))
        posts += [partial(self._post_separate, event) for event in events if event.type in SEPARATE]
        if not edits or not posts:
            _in_order(posts or edits)
            return
        with ThreadPoolExecutor(1, thread_name_prefix="notify-edits") as pool:
            edited = pool.submit(_in_order, edits)
            try:
                _in_order(posts)
            finally:
                error = edited.exception()
        if error is not None:
            raise error

    def _update_status(self, run_id: str, wandb_url: str | None) -> None:
        try:
            run = self.ledger.get_run(run_id)
        except NotFound:
            return  # a run removed from the ledger has nothing to show
        instance = self.ledger.get_instance(run.instance) if run.instance else None
        cost = run_cost(self.ledger, run)
        embed = discord.Embed.from_dict(
            fit_embed(self.scrub.deep(status_embed(run, instance, wandb_url, cost)))
        )
        known = self.client.get(notify_status_key(run_id))
        if known is not None:
            try:
                self.sink.edit(int(known), embed)
                return
            except discord.NotFound:
                log.warning("status message of run %s is gone; posting a new one", run_id)
        try:
            message_id = self.sink.post(embed=embed, key=f"status:{run_id}:{known}")
        except discord.NotFound as exc:  # the channel itself is gone (or the webhook deleted)
            raise DiscordDown(str(exc)) from exc
        self.client.set(notify_status_key(run_id), str(message_id), ex=SENT_TTL_S * 4)

    def _post_separate(self, event: Event) -> None:
        text = separate_message(event)
        if text is None or self.client.exists(notify_sent_key(event.id)):
            return
        try:
            self.sink.post(content=truncate(self.scrub(text), CONTENT_MAX), key=event.id)
        except discord.NotFound as exc:
            raise DiscordDown(str(exc)) from exc
        self.client.set(notify_sent_key(event.id), "1", ex=SENT_TTL_S)


def _in_order(work: list[Callable[[], None]]) -> None:
    for piece in work:
        piece()
