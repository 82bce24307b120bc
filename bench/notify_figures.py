"""bench/notify.py's figures: each event's latency on one side's fake Discord, and which runs met a 429.

Read from what the fake recorded (its messages with their creation and edit times, the 429s it answered
with when and where) and from the events in the side's Redis; bench/notify.py's docstring defines them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis

from bot.board import TITLE as BOARD_TITLE
from bot.notifier import PICTURED
from bot.render import SEPARATE, separate_message
from state.keys import EVENTS_STREAM
from state.payloads import Event
from tests.fakes import FakeDiscord


@dataclass(frozen=True)
class Hit:
    """A 429 the fake answered: in which channel or thread (the bucket's major parameter), when (wall
    clock, as the fake's message times) and how long discord.py then holds that route (its Retry-After)."""

    channel: str
    at: float
    retry_after: float


@dataclass
class SideFigures:
    """One side's latencies (seconds), grouped; and its runs, those that met a 429, and the 429s."""

    every: list[float] = field(default_factory=list)  # every event, each run's first included
    first: list[float] = field(default_factory=list)  # each run's first event (its thread started)
    spared: list[float] = field(default_factory=list)  # every event of the runs that met no 429
    pictured: list[float] = field(default_factory=list)  # results and failures (with the loss picture)
    plain: list[float] = field(default_factory=list)  # every other event
    runs: int = 0
    runs_met_429: int = 0
    injected_429: int = 0  # 429s the fake was told to answer
    over_limit_429: int = 0  # 429s for requests over Discord's limits (discord.py went over them)
    windows_filled: int = 0  # bucket windows used up: discord.py had to wait for the next
    requests: int = 0  # message creates, edits and thread starts


def _at(version: dict[str, Any]) -> float:
    return datetime.fromisoformat(version["at"]).timestamp()


def hits(fake: FakeDiscord, injected_retry_after: float) -> list[Hit]:
    """Every 429 the fake answered: the injected ones (all with `injected_retry_after`) and those over a
    limit."""
    state = fake.state()
    found = [Hit(f["channel"], f["at"], injected_retry_after) for f in state["faults_served"]]
    with fake.limits.lock:
        refused = list(fake.limits.refused)
    return found + [Hit(r.major, r.at, r.retry_after) for r in refused]


def met_429(
    found: list[Hit],
    channel: str,
    threads: dict[str, str],
    first_at: dict[str, float],
    ready: dict[str, float],
) -> set[str]:
    """The runs that met a 429: one in their thread (`threads`: thread id -> run), or one on the channel's
    routes while their first event waited there (from `first_at` less the Retry-After, to `ready`: the
    thread's first message; never ready: to the end)."""
    met = set()
    for hit in found:
        if hit.channel in threads:
            met.add(threads[hit.channel])
        elif hit.channel == channel:
            met |= {
                run
                for run, t0 in first_at.items()
                if t0 <= hit.at + hit.retry_after and ready.get(run, math.inf) >= hit.at
            }
    return met


def side_figures(
    fake: FakeDiscord,
    client: redis.Redis[str],
    channel: int,
    injected_retry_after: float,
    ops: tuple[str, ...],
) -> SideFigures:
    """The latencies of every event on this side (see bench/notify.py), grouped."""
    state = fake.state()
    own = {
        t: th["name"].split(" · ")[0] for t, th in state["threads"].items() if th["parent_id"] == str(channel)
    }
    messages = [m for c in (str(channel), *own) for m in state["channels"].get(c, [])]
    ready = {
        run: min(_at(m["created"]) for m in state["channels"][t])
        for t, run in own.items()
        if state["channels"].get(t)
    }
    posted = {m["created"]["content"]: _at(m["created"]) for m in messages if m["created"]["content"]}
    status: dict[str, list[float]] = {}  # run -> when its status showed: its status message, the board
    for m in messages:
        versions = [m["created"], *m["edits"]]
        if m["embeds"] and m["embeds"][0].get("title") != BOARD_TITLE:
            run_id = m["embeds"][0]["title"].split(" · ")[0]
            status.setdefault(run_id, []).extend(_at(v) for v in versions)
        for v in versions:  # a board (bot.board) on a thread-starting message: every run it lists
            for embed in v["embeds"][:1]:
                if embed.get("title") == BOARD_TITLE:
                    for f in embed.get("fields", []):
                        status.setdefault(f["name"].split(" · ")[0], []).append(_at(v))
    took: list[tuple[Event, float]] = []
    for _sid, fields in client.xrange(EVENTS_STREAM):
        event = Event.model_validate_json(fields["event"])
        text = separate_message(event) if event.type in SEPARATE else None
        if text is not None:
            took.append((event, posted[text] - event.time))
        elif event.run_id is not None:
            took.append((event, min(t for t in status[event.run_id] if t >= event.time) - event.time))
    first_at: dict[str, float] = {}
    for event, _ in took:
        first_at.setdefault(event.run_id or "", event.time)
    met = met_429(hits(fake, injected_retry_after), str(channel), own, first_at, ready)
    out = SideFigures(
        runs=len(first_at),
        runs_met_429=len(met),
        injected_429=len(state["faults_served"]),
        over_limit_429=state["over_limit"],
        windows_filled=state["windows_filled"],
        requests=sum(state["requests"].get(op, 0) for op in ops),
    )
    seen: set[str] = set()
    for event, seconds in took:
        run = event.run_id or ""
        out.every.append(seconds)
        (out.pictured if event.type in PICTURED else out.plain).append(seconds)
        if run not in seen:
            out.first.append(seconds)
            seen.add(run)
        if run not in met:
            out.spared.append(seconds)
    return out


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def figures(values: list[float]) -> dict[str, Any]:
    """How many, p50, p99 and max, in milliseconds (no events: only the count)."""
    if not values:
        return {"events": 0}
    ms = [v * 1000 for v in values]
    return {
        "events": len(ms),
        "p50_ms": round(percentile(ms, 50), 1),
        "p99_ms": round(percentile(ms, 99), 1),
        "max_ms": round(max(ms), 1),
    }
