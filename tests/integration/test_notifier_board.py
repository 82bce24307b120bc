"""The board (bot.board) under Discord's own limits: runs that wait for their threads show meanwhile.

Ten runs start at once, as a sweep's do, into the fake Discord with Discord's per-channel limits at their
real size (5 message creates, 5 edits, 5 thread starts per 5 s: tests.fakes.discord_limits). Each run's
thread costs a message and a thread start in the channel, so at most five runs get theirs at once and
the others wait for the next window. Those are listed on the newest thread-starting message (an edit, a
route they do not wait on) within a moment, long before their threads, and the board is taken off once
all have them.
The notifier posts as the bot through discord.py's own HTTP client, in this process.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import pytest
import redis

from bot.board import TITLE
from tests.factories import Script
from tests.fakes import FakeDiscord
from tests.integration.test_notifier_burst import CHANNEL, TOKEN, as_bot, threads

pytestmark = pytest.mark.integration

LIMITS = {op: (5, 5.0) for op in ("create_message", "edit_message", "start_thread")}
RUNS = [f"w{i}" for i in range(10)]


def _at(version: dict[str, Any]) -> float:
    return datetime.fromisoformat(version["at"]).timestamp()


def boards(starters: list[dict[str, Any]]) -> list[tuple[float, set[str]]]:
    """Every version of a thread-starting message that was a board: when, and the runs it listed."""
    return [
        (_at(v), {f["name"].split(" · ")[0] for f in v["embeds"][0]["fields"]})
        for m in starters
        for v in [m["created"], *m["edits"]]
        if v["embeds"] and v["embeds"][0].get("title") == TITLE
    ]


def on_board(fake: FakeDiscord) -> bool:
    """A thread-starting message carries the board now."""
    return any(m["embeds"] for m in fake.state()["channels"][str(CHANNEL)])


def test_runs_waiting_on_the_channels_limits_are_listed_on_the_board_meanwhile(
    redis_client: redis.Redis[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script(redis_client)
    for run_id in RUNS:
        script.create(run_id)
    with (
        FakeDiscord(token=TOKEN, rate_limits=LIMITS) as fake,
        as_bot(fake, redis_client, monkeypatch) as notifier,
    ):
        began = time.time()
        assert notifier.process_once() == len(RUNS) and notifier.last_error is None
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and on_board(fake):
            time.sleep(0.2)  # the last one out takes the board off, within its next edit
        state = fake.state()
        notifier.close()

    starters = state["channels"][str(CHANNEL)]
    assert len(starters) == len(RUNS) and state["over_limit"] == 0  # nothing went over a limit
    assert not any(m["embeds"] for m in starters), "the board was not taken off"
    ready = {
        run_id: min(_at(m["created"]) for m in state["channels"][thread])
        for run_id, thread in threads(fake).items()
    }
    assert sorted(ready) == RUNS
    waited = sorted(run for run, at in ready.items() if at - began >= 1.0)  # a later window's
    assert len(waited) >= 5, {run: round(at - began, 2) for run, at in ready.items()}
    listed = boards(starters)
    for run_id in waited:  # listed within a moment (its thread came a window later)
        first = min(at for at, runs in listed if run_id in runs)
        assert first - began < 2.5 and first < ready[run_id], (run_id, first - began, ready[run_id] - began)
    assert set().union(*(runs for _at_, runs in listed)) == set(waited)  # only the runs that waited
