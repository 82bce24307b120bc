"""The board: while runs wait for their threads, the channel's newest thread-starting message lists them.

Discord limits a channel to 5 message creates per 5 s (and, the notifier assumes, as many thread starts),
and each run's thread costs one of each: a sweep that starts ten runs at once has its last five wait a
whole window, or more, before anything of theirs would show. The board shows them meanwhile, without a
request on the routes they wait for: it edits (a route of its own) the message the newest thread started
from, which is already at the bottom of the channel, adding an embed with one line per waiting run,
rendered from the ledger as it is now. So a waiting run's events show within a tick or two; once its
thread has its status message, the run leaves the board, and when none is left the embed is taken off.

A run goes on the board once it has waited `after_s` for its thread (so a lone start never touches it).
While it shows, every run that waits is on it. It is looked at when the notifier reads an event (`nudge`),
when a run starts or stops waiting, the moment the edit budget allows one more edit after a look it held
back, and every `poll_s` besides (what no event announced); it is edited when what it shows changed, `gap_s`
after its last edit at the soonest: Discord allows a channel `budget` edits per
`window_s` (5 per 5 s), one a second for as long as a wait lasts (a burst would leave the rest of the
window without one; the window is counted here too, so no edit waits inside discord.py). At most
FIELDS_MAX runs are listed (the rest counted in the description). The board is a view, not a
record: a notifier that dies mid-wait leaves its last version standing on that message.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import discord
from discord.types.embed import Embed as EmbedData
from discord.types.embed import EmbedField

from bot.render import FIELDS_MAX, fit_embed
from state.models import Run

log = logging.getLogger(__name__)

TITLE = "Waiting for their threads"  # the board's embed title (what tells it from a run's status)
AFTER_S = 0.25  # a run waiting this long for its thread goes on the board
EDITS, WINDOW_S = 5, 5.0  # Discord's limit on a channel's message edits: 5 per 5 s
GAP_S = WINDOW_S / EDITS  # the board is edited at most this often
POLL_S = 0.25  # how often it looks at the waiting runs besides when nudged

Line = Callable[[str], Run | None]  # a run as the ledger holds it now (None: gone)
Edit = Callable[[int, discord.Embed | None], None]  # edit a channel message's embed (None: remove it)


def line(run: Run) -> tuple[str, str]:
    """A waiting run's line: its thread's name, and where it is."""
    where = [run.state.value]
    if not run.state.is_terminal() and run.state.stage is not None:
        where.append(run.state.stage.value)
    if run.progress.step is not None:
        where.append(f"step {run.progress.step}/{run.progress.total_steps or '?'}")
    return f"{run.run_id} · {run.source}", " · ".join(where)


class Board:
    """Runs waiting for their threads, shown on the newest thread-starting message (see the module)."""

    def __init__(
        self,
        get_run: Line,
        edit: Edit,
        after_s: float = AFTER_S,
        budget: int = EDITS,
        window_s: float = WINDOW_S,
        gap_s: float = GAP_S,
        poll_s: float = POLL_S,
    ) -> None:
        self.get_run, self.edit = get_run, edit
        self.after_s, self.gap_s, self.poll_s = after_s, gap_s, poll_s
        self.budget, self.window_s = budget, window_s
        self._edited: deque[float] = deque()  # when it was edited, within the last window_s (monotonic)
        self._lock = threading.Lock()
        self._waiting: dict[str, float] = {}  # run -> since when (monotonic), in the order they came
        self._newest: int | None = None  # the newest message a thread started from
        self._on: int | None = None  # the message the board is on now (None: it shows nothing)
        self._shown: list[tuple[str, str]] = []  # what it shows
        self._stop = threading.Event()
        self._wake = threading.Event()  # something may have changed: look now
        self._thread = threading.Thread(target=self._loop, name="notify-board", daemon=True)
        self._thread.start()

    def waiting(self, run_id: str) -> None:
        """`run_id` waits for its thread from now."""
        with self._lock:
            self._waiting.setdefault(run_id, time.monotonic())
        self._wake.set()

    def starter(self, message_id: int) -> None:
        """A thread started from channel message `message_id`: the newest, where the next board goes."""
        with self._lock:
            self._newest = message_id
        self._wake.set()

    def started(self, run_id: str) -> None:
        """`run_id` has its status message (in its thread, or in the channel): it waits no more."""
        with self._lock:
            self._waiting.pop(run_id, None)
        self._wake.set()

    def nudge(self) -> None:
        """An event was written: a waiting run's line may have changed."""
        self._wake.set()

    def close(self) -> None:
        """Stop; a board still showing is taken off (best effort)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(10)
        with self._lock:
            self._waiting.clear()
        self._show(closing=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # before the look: a nudge during it wakes the next wait at once
            try:
                held = self._show()
            except Exception:  # the board is a view: a failed edit is tried again next look
                log.exception("the notifier's board could not be updated")
                held = self.poll_s
            if held > 0:  # held back by the edit budget: look again the moment it allows an edit
                self._stop.wait(held)
            else:
                self._wake.wait(self._idle_s())

    def _idle_s(self) -> float:
        """How long to wait for a nudge: `poll_s`, or less when a waiting run comes due sooner. Only runs not
        yet due count: one already due that the board cannot show (no thread started yet, or the run is
        gone) waits for a nudge like the rest, or the loop would spin."""
        if self._on is not None:
            return self.poll_s
        now = time.monotonic()
        with self._lock:
            due_in = [d for since in self._waiting.values() if (d := since + self.after_s - now) > 0]
        return min([self.poll_s, *due_in])

    def _held_s(self, now: float) -> float:
        """How long the edit budget holds the next edit back (0: it may be made now)."""
        while self._edited and now - self._edited[0] >= self.window_s:
            self._edited.popleft()
        held = 0.0
        if len(self._edited) >= self.budget:
            held = self._edited[0] + self.window_s - now
        if self._edited:
            held = max(held, self._edited[-1] + self.gap_s - now)
        return held

    def _show(self, closing: bool = False) -> float:
        """Edit the board to what it should show now, when that changed and the budget allows (`closing`:
        regardless). Returns how long the budget holds back an edit that may be wanted (0: none is)."""
        now = time.monotonic()
        held = self._held_s(now)
        with self._lock:
            wanted = self._on is not None or bool(self._waiting)
        if not closing and held > 0:
            return held if wanted else 0.0
        after = 0.0 if self._on is not None else self.after_s  # showing: the channel is backed up
        with self._lock:
            due = [run for run, since in self._waiting.items() if now - since >= after]
            on = self._on if self._on is not None else self._newest
        lines = [line(run) for run_id in due if (run := self.get_run(run_id)) is not None]
        if lines == self._shown or on is None:
            return 0.0
        self._edited.append(now)
        if not lines:
            self.edit(on, None)
            self._on, self._shown = None, []
            return 0.0
        self.edit(on, discord.Embed.from_dict(fit_embed(board_embed(lines))))
        self._on, self._shown = on, lines
        return 0.0


def board_embed(lines: list[tuple[str, str]]) -> EmbedData:
    """The board's embed: a field per run (as many as Discord allows), the rest counted."""
    fields: list[EmbedField] = [{"name": name, "value": value} for name, value in lines[:FIELDS_MAX]]
    embed: EmbedData = {"title": TITLE, "fields": fields}
    shown = fields
    if len(lines) > len(shown):
        embed["description"] = f"and {len(lines) - len(shown)} more"
    return embed
