"""The event stream: every event goes to the fleet's stream and to its run's own stream.

Writers add events inside the ledger's transactions (so a state change and its events land together).
Readers: `read_run` / `follow_run` for the CLI, and `EventConsumer` for services such as the Discord
notifier, which read through a consumer group and ack after handling (at-least-once; dedupe on `id`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import redis

from state.keys import EVENTS_STREAM, run_events_key
from state.payloads import Event, EventType, Payload

RUN_STREAM_MAXLEN = 20_000


def new_event(payload: Payload, run_id: str | None = None) -> Event:
    """An event that belongs to no run's sequence (reaper actions and the like)."""
    return Event(id=f"x-{uuid.uuid4().hex}", type=payload.type, run_id=run_id, data=payload)


def append(pipe: redis.client.Pipeline[str], event: Event, maxlen: int) -> None:
    """Queue the XADDs of one event on a pipeline (both streams, approximately trimmed)."""
    fields: dict[Any, Any] = {"event": event.model_dump_json()}
    pipe.xadd(EVENTS_STREAM, fields, maxlen=maxlen, approximate=True)
    if event.run_id:
        pipe.xadd(run_events_key(event.run_id), fields, maxlen=RUN_STREAM_MAXLEN, approximate=True)


def _decode(entries: list[tuple[str, dict[str, str]]]) -> list[tuple[str, Event]]:
    return [(sid, Event.model_validate_json(fields["event"])) for sid, fields in entries]


def read_run(client: redis.Redis[str], run_id: str, after: str = "-") -> list[tuple[str, Event]]:
    """A run's events in order, after the stream id `after` (exclusive), or all of them."""
    start = "-" if after == "-" else f"({after}"
    return _decode(client.xrange(run_events_key(run_id), min=start, max="+"))


def follow_run(
    client: redis.Redis[str], run_id: str, after: str = "0", block_ms: int = 1000
) -> Iterator[Event]:
    """Yield a run's events as they come, forever; the caller stops iterating (e.g. on a terminal event)."""
    key = run_events_key(run_id)
    last = after
    while True:
        reply = client.xread({key: last}, block=block_ms, count=500)
        for _stream, entries in reply or []:
            for sid, event in _decode(entries):
                last = sid
                yield event


class EventConsumer:
    """Reads the fleet's stream through a consumer group: pending entries first, then new ones.

    Call `ack` once an event is handled; an entry not acked is delivered again after a restart. Entries
    held too long by a consumer that died are claimed with `claim_stale`.
    """

    def __init__(
        self, client: redis.Redis[str], group: str, consumer: str, stream: str = EVENTS_STREAM
    ) -> None:
        self.client, self.group, self.consumer, self.stream = client, group, consumer, stream
        try:
            client.xgroup_create(stream, group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._pending_after: str | None = "0"  # where reading the pending entries goes on; None: done

    def read(self, count: int = 100, block_ms: int = 1000) -> list[tuple[str, Event]]:
        """This consumer's pending entries first (each once, in order, `count` at a time), then new ones."""
        if self._pending_after is not None:
            reply = self.client.xreadgroup(
                self.group, self.consumer, {self.stream: self._pending_after}, count=count
            )
            entries = reply[0][1] if reply else []
            if entries:
                self._pending_after = entries[-1][0]
                return _decode(entries)
            self._pending_after = None
        reply = self.client.xreadgroup(
            self.group, self.consumer, {self.stream: ">"}, count=count, block=block_ms
        )
        return _decode(reply[0][1]) if reply else []

    def redeliver(self) -> None:
        """Read this consumer's pending entries again from the first (after some were not acked)."""
        self._pending_after = "0"

    def ack(self, *stream_ids: str) -> None:
        if stream_ids:
            self.client.xack(self.stream, self.group, *stream_ids)  # type: ignore[no-untyped-call]

    def claim_stale(self, min_idle_ms: int, count: int = 100) -> list[tuple[str, Event]]:
        reply = self.client.xautoclaim(self.stream, self.group, self.consumer, min_idle_ms, "0", count=count)
        return _decode(reply[1])


def wait_for(
    client: redis.Redis[str], run_id: str, types: tuple[EventType, ...], timeout_s: float
) -> Event | None:
    """Block until the run has an event of one of `types` (including past ones), or the timeout."""
    deadline = time.monotonic() + timeout_s
    for _sid, event in read_run(client, run_id):
        if event.type in types:
            return event
    last = "$"
    entries = client.xrevrange(run_events_key(run_id), count=1)
    if entries:
        last = entries[0][0]
    while (left := deadline - time.monotonic()) > 0:
        reply = client.xread({run_events_key(run_id): last}, block=max(1, int(min(left, 1.0) * 1000)))
        for _stream, raw in reply or []:
            for sid, event in _decode(raw):
                last = sid
                if event.type in types:
                    return event
    return None
