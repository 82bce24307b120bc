"""The Discord notifier: the fleet's event stream, relayed into one channel (by webhook or as the bot).

It reads `tf:events` through its own consumer group (`notifier`), so it sees every event whatever else
reads the stream. Per run it keeps ONE status message, edited in place; a few events (a failure, a
result, a W&B link, an instance kept, a reaper kill) also get a message of their own.

As the bot, each run has a thread of its own in the channel, started from a message that names the run;
the status message and the run's own messages go into the thread. Discord limits message creates and edits
per channel, and a thread is a channel: so each run has its own rate-limit buckets, and a 429 answered in
one run's thread (its Retry-After waited out by discord.py) holds up that run only. Through a webhook (which
cannot start threads in a text channel) every run shares the channel, and the webhook's buckets.

Each run's events go through a lane of their own (bot.lanes), lanes side by side: in order within a run,
the events that came while its lane was busy handled together (one status edit for ten steps). A run
whose status message exists gets its own messages first, then the edit; a new run gets its status message
first. Entries are acked per run as its lane finishes them, so a slow run never holds up another's acks.

Delivery is at least once. An error from Discord stops that run's lane without an ack: its entries (and
any that come for it meanwhile) stay pending, and come again, in order, after `backoff_s`. Status edits
render the run as the ledger holds it now, so repeating one is harmless. A separate message is posted, THEN
marked sent under `tf:notify:sent:<event id>`, then acked; a repeat whose key exists is skipped. A crash
between a post and its `sent` key: as the bot, the post carries a nonce derived from the event id and
Discord answers the repeat with the first message (the thread's first message too; starting the thread
again finds the first); through a webhook (no nonce there) that one message is posted again.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import threading
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext

import discord
import discord.http
import redis
import requests

from bot.board import Board
from bot.lanes import Lanes
from bot.render import (
    CONTENT_MAX,
    SEPARATE,
    Scrubber,
    fit_embed,
    separate_message,
    status_embed,
    thread_name,
    truncate,
)
from bot.sinks import DiscordDown, Sink, WebhookSink
from core.errors import ConfigError, NotFound, Problem
from core.secrets import Secrets
from core.settings import Settings
from service import plot
from service.describe import loss_curve
from service.painter import Painter
from state.cost import run_cost
from state.events import EventConsumer
from state.keys import (
    ALIVE_TTL_S,
    NOTIFIER_GROUP,
    alive_key,
    notify_sent_key,
    notify_status_key,
    notify_thread_key,
)
from state.ledger import Ledger
from state.models import Run
from state.payloads import Event, EventType, WandbRun

log = logging.getLogger(__name__)

SENT_TTL_S = 7 * 24 * 3600
LANES = 256  # runs handled at once (a lane waiting on the channel holds a thread: room for a burst)
MAX_IN_FLIGHT = 2000  # entries read but not handled yet: reading waits beyond this
PICTURED = (EventType.RUN_SUCCEEDED, EventType.RUN_FAILED)  # messages that carry the run's loss picture
NO_THREAD = "0"  # under notify_thread_key: the run's messages stay in the channel
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
        lanes: int = LANES,
    ) -> None:
        self.client = client
        self.ledger = Ledger(client)
        self.sink = sink
        self.consumer = EventConsumer(client, NOTIFIER_GROUP, consumer or f"{socket.gethostname()}-notifier")
        self.scrub = Scrubber([*secret_values, sink.secret])
        self.block_ms, self.batch, self.backoff_s = block_ms, batch, backoff_s
        self.ack_enabled = True  # tests turn it off to act out a crash between posting and acking
        self.last_error: str | None = None
        self.lanes: Lanes[tuple[str, Event]] = Lanes(self._lane, lanes, "notify")
        self.painter = Painter()  # pictures drawn beside, not in, this process (service.painter says why)
        self._lock = threading.Lock()
        self._in_flight: set[str] = set()  # stream ids read and not handled yet (a redelivery skips them)
        self._stopped: dict[str, str] = {}  # run (or "" for fleet events) -> why its lane stopped
        self._handled = 0
        # One request at a time per route of the channel itself (posts, edits, thread starts: every run's): a
        # burst of lanes there would cross its limits before discord.py learned them. A thread is its run's.
        self._posts, self._edits, self._starts = threading.Lock(), threading.Lock(), threading.Lock()
        # Runs waiting for their threads are listed on the newest thread-starting message (bot.board).
        self.board = Board(self._board_run, self._board_edit) if sink.threads else None

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
        """Read and hand out events until `stop` is set, without waiting for the lanes (a slow run holds
        up only itself); runs whose lane stopped on an error get their entries again after `backoff_s`."""
        stopped_at: float | None = None
        alive_at = 0.0
        while not stop.is_set():
            if time.monotonic() - alive_at >= ALIVE_TTL_S / 4:  # `fleet health notifier` reads it
                with contextlib.suppress(redis.RedisError):
                    self.client.set(alive_key("notifier", socket.gethostname()), "1", ex=ALIVE_TTL_S)
                alive_at = time.monotonic()
            with self._lock:
                stopped = bool(self._stopped)
            if stopped and stopped_at is None:
                stopped_at = time.monotonic()
            if stopped_at is not None and time.monotonic() - stopped_at >= self.backoff_s:
                self._again()
                stopped_at = None
            if not self.lanes.wait(below=MAX_IN_FLIGHT, timeout=1.0):
                continue
            self._dispatch(self.consumer.read(count=self.batch, block_ms=self.block_ms))
        self.lanes.wait(timeout=10.0)  # what is under way goes out; the rest stays pending for next time
        self.close()

    def close(self) -> None:
        """Stop the lanes' threads, the board and the painter (what a lane is doing still ends)."""
        self.lanes.close()
        if self.board is not None:
            self.board.close()
        self.painter.close()

    def process_once(self) -> int:
        """Read one batch (blocking up to `block_ms`), relay it and wait until it is handled; returns how
        many events were handled. When Discord failed a run's messages, `last_error` says why and that
        run's entries stay pending (not acked): they come again, first, on the next call."""
        self.last_error = None
        self._dispatch(self.consumer.read(count=self.batch, block_ms=self.block_ms))
        self.lanes.wait()
        with self._lock:
            handled, self._handled = self._handled, 0
            self.last_error = next(iter(self._stopped.values()), None)
        if self.last_error is not None:
            self._again()
        return handled

    def _dispatch(self, entries: list[tuple[str, Event]]) -> None:
        """Each entry to its run's lane; skipped: one being handled (a redelivery came early) and those of
        a run whose lane stopped (left pending, they come again in order)."""
        for sid, event in entries:
            key = event.run_id or ""
            with self._lock:
                if sid in self._in_flight or key in self._stopped:
                    continue
                self._in_flight.add(sid)
            self.lanes.add(key, (sid, event))
        if entries and self.board is not None:  # a waiting run's line on it may have changed
            self.board.nudge()

    def _again(self) -> None:
        """Read this consumer's pending entries again from the first: the stopped runs' go round again."""
        with self._lock:
            self._stopped.clear()
        self.consumer.redeliver()

    def _lane(self, run_id: str, entries: list[tuple[str, Event]]) -> None:
        """One run's entries, handled in order: then acked; on an error left pending, the lane stopped."""
        sids = [sid for sid, _event in entries]
        try:
            self._handle(run_id, [event for _sid, event in entries])
        except Exception as exc:
            if isinstance(exc, DiscordDown):
                log.warning("discord refused run %s's messages (%s); they will be retried", run_id, exc)
            else:
                log.exception("run %s's messages failed; they will be retried", run_id)
            with self._lock:
                self._stopped[run_id] = str(exc) or type(exc).__name__
                self._in_flight.difference_update(sids)
                for sid, _event in self.lanes.drop(run_id):
                    self._in_flight.discard(sid)
            return
        if self.ack_enabled:
            self.consumer.ack(*sids)
        with self._lock:
            self._in_flight.difference_update(sids)
            self._handled += len(sids)

    # -- one run's events --------------------------------------------------------------------------
    def _handle(self, run_id: str, events: list[Event]) -> None:
        """A run's status message first when it has none yet, else after its messages of their own (an
        edit never holds up a post); events of no run (fleet-wide) get only their own messages."""
        wandb_url = next(
            (e.data.url for e in reversed(events) if isinstance(e.data, WandbRun) and e.data.url), None
        )
        separate = [event for event in events if event.type in SEPARATE]
        if not run_id:
            for event in separate:
                self._post_separate(event, None)
            return
        try:
            run = self.ledger.get_run(run_id)
        except NotFound:
            run = None  # a run removed from the ledger: its messages of their own still go out
        if run is None:
            thread = self._known_thread(run_id)
            posted = [(event, self._post_separate(event, thread)) for event in separate]
        else:
            thread = self._thread(run)
            status = self.client.get(notify_status_key(run_id))  # its status message's id, once it has one
            if status is None:
                self._update_status(run, wandb_url, thread, None)
                if self.board is not None:
                    self.board.started(run_id)
            posted = [(event, self._post_separate(event, thread)) for event in separate]
            if status is not None:
                self._update_status(run, wandb_url, thread, status)
        for event, message_id in posted:  # last: a picture takes a moment to draw, and nothing waits on it
            if message_id is not None:
                self._attach_picture(event, message_id, thread)

    def _known_thread(self, run_id: str) -> int | None:
        known = self.client.get(notify_thread_key(run_id))
        return _thread_id(known) if known else None

    def _thread(self, run: Run) -> int | None:
        """The run's thread (started now from a message naming the run, when the sink can and it has none
        yet); None: its messages go into the channel."""
        if not self.sink.threads:
            return None
        known = self.client.get(notify_thread_key(run.run_id))
        if known is not None:
            return _thread_id(known)
        name = self.scrub(thread_name(run))
        if self.board is not None:  # shown there should its start wait on the channel's routes
            self.board.waiting(run.run_id)
        try:
            with self._posts:
                starter = self.sink.post(content=name, key=f"thread:{run.run_id}")
        except discord.NotFound as exc:  # the channel itself is gone
            raise DiscordDown(str(exc)) from exc
        with self._starts:  # a route of its own: the next run's message goes out meanwhile
            thread = self.sink.start_thread(starter, name)
        if self.board is not None and thread is not None:
            self.board.starter(starter)
        if thread is None:
            log.warning(
                "run %s: no thread (the bot may not start threads here); it posts in the channel", run.run_id
            )
        self.client.set(notify_thread_key(run.run_id), str(thread or NO_THREAD), ex=SENT_TTL_S * 4)
        return thread

    def _update_status(self, run: Run, wandb_url: str | None, thread: int | None, known: str | None) -> None:
        """Edit the run's status message `known` (its id), or post one when it has none (or it is gone)."""
        run_id = run.run_id
        instance = self.ledger.get_instance(run.instance) if run.instance else None
        cost = run_cost(self.ledger, run)
        embed = discord.Embed.from_dict(
            fit_embed(self.scrub.deep(status_embed(run, instance, wandb_url, cost)))
        )
        if known is not None:
            try:
                with self._route(thread, self._edits):
                    self.sink.edit(int(known), embed, thread)
                return
            except discord.NotFound:
                log.warning("status message of run %s is gone; posting a new one", run_id)
        try:
            with self._route(thread, self._posts):
                message_id = self.sink.post(embed=embed, key=f"status:{run_id}:{known}", thread=thread)
        except discord.NotFound as exc:  # the run's thread is gone, or the channel (or the webhook)
            raise self._gone(run_id, thread, exc) from exc
        self.client.set(notify_status_key(run_id), str(message_id), ex=SENT_TTL_S * 4)

    def _post_separate(self, event: Event, thread: int | None) -> int | None:
        """Post the event's message of its own; its id (None: it has none, or it went out before)."""
        text = separate_message(event)
        if text is None or self.client.exists(notify_sent_key(event.id)):
            return None
        try:
            with self._route(thread, self._posts):
                message_id = self.sink.post(
                    content=truncate(self.scrub(text), CONTENT_MAX), key=event.id, thread=thread
                )
        except discord.NotFound as exc:
            raise self._gone(event.run_id or "", thread, exc) from exc
        self.client.set(notify_sent_key(event.id), "1", ex=SENT_TTL_S)
        return message_id

    def _attach_picture(self, event: Event, message_id: int, thread: int | None) -> None:
        """A run's result or failure message gets its loss picture (service.plot), when it reported a loss:
        attached once the message is out, so the message never waits for the drawing. A picture that
        cannot be drawn or attached is logged; the message stays as it is."""
        if event.type not in PICTURED or not event.run_id:
            return
        try:
            curve = loss_curve(self.client, event.run_id)
            if not plot.has_points(curve):
                return
            title = f"{event.run_id} ({event.type.value.split('.')[1].upper()})"
            picture = (f"{event.run_id}-loss.png", self.painter.png(curve, title))
            with self._route(thread, self._edits):
                self.sink.attach(message_id, picture, thread)
        except Exception:
            log.exception("run %s: its loss picture could not be drawn or attached", event.run_id)

    def _board_run(self, run_id: str) -> Run | None:
        try:
            return self.ledger.get_run(run_id)
        except NotFound:
            return None

    def _board_edit(self, message_id: int, embed: discord.Embed | None) -> None:
        with self._edits:
            self.sink.edit(message_id, embed)

    def _route(self, thread: int | None, channel: threading.Lock) -> AbstractContextManager[object]:
        """A run's thread is its own; the channel's route (`channel`: its lock) is taken in turn."""
        return nullcontext() if thread is not None else channel

    def _gone(self, run_id: str, thread: int | None, exc: discord.NotFound) -> DiscordDown:
        """Where a post went is gone. A run's thread (someone deleted it): the run's messages go to the
        channel from now on, with a new status message there. The channel: retried until it is back."""
        if thread is not None:
            log.warning("run %s: its thread is gone; its messages go to the channel", run_id)
            self.client.set(notify_thread_key(run_id), NO_THREAD, ex=SENT_TTL_S * 4)
            self.client.delete(notify_status_key(run_id))
        return DiscordDown(str(exc))


def _thread_id(known: str) -> int | None:
    """A run's stored thread: its id, or None where its messages go into the channel (NO_THREAD)."""
    return int(known) if known != NO_THREAD else None
