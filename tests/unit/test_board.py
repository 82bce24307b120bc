"""bot.board: runs that wait for their threads longer than `after_s` are listed on the newest
thread-starting message, each line as the ledger holds the run now; a run leaves once it has its status
message, and the last one out takes the board off. Its own thread, edits recorded here."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import discord
import pytest

from bot.board import TITLE, Board
from jobs.sections.local import LocalSection
from state.models import Run
from state.stages import RunState
from tests.factories import ledger_run

TICK_S = 0.05  # the least gap between the board's edits, here


class Channel:
    """The runs as the ledger holds them, and the board's edits as Discord would have them."""

    def __init__(self) -> None:
        self.runs: dict[str, Run] = {}
        self.edits: list[tuple[int, list[tuple[str, str]] | None]] = []
        self.changed = threading.Condition()

    def get_run(self, run_id: str) -> Run | None:
        return self.runs.get(run_id)

    def edit(self, message_id: int, embed: discord.Embed | None) -> None:
        with self.changed:
            if embed is None:
                self.edits.append((message_id, None))
            else:
                assert embed.title == TITLE
                self.edits.append((message_id, [(f.name or "", f.value or "") for f in embed.fields]))
            self.changed.notify_all()

    def wait(self, check: Callable[[], bool]) -> None:
        with self.changed:
            assert self.changed.wait_for(check, 5), self.edits


@pytest.fixture
def channel() -> Channel:
    found = Channel()
    for run_id in ("r1", "r2", "r3"):
        found.runs[run_id] = ledger_run(run_id, LocalSection())
    return found


@pytest.fixture
def board(channel: Channel) -> Iterator[Board]:
    made = Board(channel.get_run, channel.edit, after_s=0.2, window_s=2.0, gap_s=TICK_S, poll_s=TICK_S / 5)
    yield made
    made.close()


def test_waiting_runs_are_listed_on_the_newest_starter_then_taken_off(channel: Channel, board: Board) -> None:
    board.starter(100)
    board.starter(101)  # the newest: the board goes there
    board.waiting("r1")
    board.waiting("r2")
    channel.wait(lambda: len(channel.edits) >= 1)
    (first,) = channel.edits
    assert first == (101, [("r1 · t", "QUEUED · provision"), ("r2 · t", "QUEUED · provision")])

    channel.runs["r2"] = channel.runs["r2"].model_copy(update={"state": RunState.PROVISIONING})
    channel.wait(lambda: len(channel.edits) >= 2)  # what changed shows, on the same message
    now = [("r1 · t", "QUEUED · provision"), ("r2 · t", "PROVISIONING · provision")]
    assert channel.edits[1] == (101, now)

    board.starter(102)  # a newer starter: the board stays where it is while it shows
    board.started("r1")
    channel.wait(lambda: len(channel.edits) >= 3)
    assert channel.edits[2] == (101, [("r2 · t", "PROVISIONING · provision")])
    board.started("r2")
    channel.wait(lambda: len(channel.edits) >= 4)
    assert channel.edits[3] == (101, None)  # taken off

    board.waiting("r3")  # the next wait: on the newest starter
    channel.wait(lambda: len(channel.edits) >= 5)
    assert channel.edits[4] == (102, [("r3 · t", "QUEUED · provision")])


def test_a_run_that_gets_its_thread_in_time_never_touches_the_board(channel: Channel, board: Board) -> None:
    board.starter(100)
    board.waiting("r1")
    time.sleep(0.05)
    board.started("r1")
    time.sleep(0.2 + 4 * TICK_S)
    assert channel.edits == []


def test_with_no_starter_yet_nothing_is_edited(channel: Channel, board: Board) -> None:
    board.waiting("r1")
    time.sleep(0.2 + 4 * TICK_S)
    assert channel.edits == []
    board.starter(7)  # the first thread started: the run still waiting shows there
    channel.wait(lambda: len(channel.edits) >= 1)
    assert channel.edits == [(7, [("r1 · t", "QUEUED · provision")])]


def test_a_due_run_it_cannot_show_yet_waits_for_a_nudge_without_spinning(channel: Channel) -> None:
    """A run past due with no thread started yet to show it on: the board waits for the next nudge (or its
    poll), it does not look again and again meanwhile."""
    looks: list[str] = []

    def get_run(run_id: str) -> Run | None:
        looks.append(run_id)
        return channel.get_run(run_id)

    board = Board(get_run, channel.edit, after_s=0.0, window_s=5.0, gap_s=0.0, poll_s=30.0)
    try:
        board.waiting("r1")
        time.sleep(0.5)
        assert len(looks) <= 3, f"{len(looks)} looks in 0.5 s with nothing to show"
        board.starter(4)
        channel.wait(lambda: len(channel.edits) == 1)
        assert channel.edits == [(4, [("r1 · t", "QUEUED · provision")])]
    finally:
        board.close()


def test_its_edits_keep_within_the_channels_limit(channel: Channel) -> None:
    """Two edits a second here, with no gap between them: a third change waits for the window, then shows."""
    board = Board(channel.get_run, channel.edit, after_s=0.0, budget=2, window_s=1.0, gap_s=0, poll_s=0.01)
    try:
        board.starter(1)
        board.waiting("r1")
        channel.wait(lambda: len(channel.edits) == 1)
        shown = time.monotonic()
        channel.runs["r1"] = channel.runs["r1"].model_copy(update={"state": RunState.PROVISIONING})
        channel.wait(lambda: len(channel.edits) == 2)  # the second edit in the window: at once
        assert time.monotonic() - shown < 0.5
        channel.runs["r1"] = channel.runs["r1"].model_copy(update={"state": RunState.PREPARING})
        channel.wait(lambda: len(channel.edits) == 3)
        assert time.monotonic() - shown >= 0.9  # held for the window's end, not dropped
        assert channel.edits[-1] == (1, [("r1 · t", "PREPARING · prepare")])
    finally:
        board.close()


def test_a_nudge_shows_a_change_at_once_or_the_moment_the_gap_allows(channel: Channel) -> None:
    """The notifier nudges the board as it reads events: the change shows then, not a poll later, and an
    edit the gap held back is made as the gap ends."""
    board = Board(channel.get_run, channel.edit, after_s=0.0, window_s=5.0, gap_s=0.4, poll_s=30.0)
    try:
        board.starter(1)
        board.waiting("r1")  # (starting to wait is a nudge of its own)
        channel.wait(lambda: len(channel.edits) == 1)
        shown = time.monotonic()
        channel.runs["r1"] = channel.runs["r1"].model_copy(update={"state": RunState.PROVISIONING})
        board.nudge()
        channel.wait(lambda: len(channel.edits) == 2)
        assert 0.35 <= time.monotonic() - shown < 0.6  # held for the gap, then at once
        channel.runs["r1"] = channel.runs["r1"].model_copy(update={"state": RunState.PREPARING})
        time.sleep(0.8)
        assert len(channel.edits) == 2  # no nudge, no look before the poll (30 s here)
        board.nudge()
        channel.wait(lambda: len(channel.edits) == 3)
        assert channel.edits[-1] == (1, [("r1 · t", "PREPARING · prepare")])
    finally:
        board.close()
