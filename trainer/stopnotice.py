"""A stop the node was told of: its machine is being taken back (a spot machine preempted, a container
stopped), and the trainer has a short while to keep what it did.

Two ways in, one meaning: SIGTERM to the trainer's own process (a container's stop reaches it, or `ray job
stop`), which only the main thread can catch, and the node's notice file, `$FLEET_STOP_NOTICE`, which any
process of the run can see (Ray Train's workers run in actors, where no signal handler can be set), written
by whatever learns of the stop first (the node's start script on SIGTERM, a vendor's notice). The file is
the machine's own (a rented node's start script puts it in the container's /tmp), never on a volume that
another machine may mount, whose stop is not this one's; one older than this trainer is a leftover of an
earlier start of the same container, never obeyed. Once the checkpoint is kept, the trainer says so in a
STOPPED line and in the notice's `.saved` file, which the node's start script waits for before it ends Ray
(providers.bootstrap: a machine whose stop gives it more time than the save took goes at once, not after
its whole grace).

The builtin recipe asks after every optimizer step (every worker agrees: a collective): on a stop it saves
a checkpoint at that step, says so, and then waits (WAIT_S) to be killed with its machine rather than
ending the Ray job at once, so the fleet sees a lost node (and replaces it, resuming from the checkpoint),
not a failed run; a machine that stays (a local node, a stopped Ray job) sees the trainer end after it.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from trainer import lines

NOTICE_ENV = "FLEET_STOP_NOTICE"  # the notice file's path, in the node's environment
SAVED_SUFFIX = ".saved"  # the trainer's answer beside it: its checkpoint is kept (the start script's cue)
# How long a stopped trainer waits for its machine to go before it ends itself: longer than a container's
# stop takes (docker's grace is 10 s), short enough that a trainer whose machine stays (a local node, a
# `ray job stop`) does not linger.
WAIT_S = 20.0


class StopNotice:
    """Whether this trainer was told to stop (module docstring)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        path = environ.get(NOTICE_ENV)
        self.path = Path(path) if path else None
        self.since = time.time()
        self.signalled = False
        self._before: Any = None

    def install(self) -> None:
        """Catch SIGTERM in this process while it trains, when this is its main thread (elsewhere only the
        file tells); `restore` puts the handler before it back."""
        if threading.current_thread() is threading.main_thread():
            self._before = signal.signal(signal.SIGTERM, self._on_term)

    def restore(self) -> None:
        """Training is over: SIGTERM does what it did before `install`."""
        if self._before is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._before)
            self._before = None

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        self.signalled = True

    def why(self) -> str | None:
        """Why the trainer must stop, or None: SIGTERM, or a notice file written since it started."""
        if self.signalled:
            return "SIGTERM"
        if self.path is None:
            return None
        try:
            written = self.path.stat().st_mtime
        except OSError:
            return None
        return f"the node's stop notice ({self.path})" if written >= self.since - 1.0 else None

    def saved(self) -> None:
        """Tell the node the checkpoint is kept (the notice's `.saved` file)."""
        if self.path is not None:
            saved = self.path.with_name(self.path.name + SAVED_SUFFIX)
            with contextlib.suppress(OSError):  # where it cannot be written the node only loses the early end
                saved.write_text(f"{time.time():.3f}\n", encoding="utf-8")


def wait_for_the_end(notice: StopNotice, step: int, why: str, saved_in_s: float, main: bool) -> None:
    """Say what was kept (a STOPPED line from the `main` process; every process tells the node, whose
    start script then ends Ray), then wait (WAIT_S) to be killed with the machine, and end (see the
    module)."""
    if main:
        lines.emit(lines.Stopped(step=step, why=why, saved_in_s=round(saved_in_s, 3)))
        sys.stdout.flush()
    notice.saved()
    print(
        f"trainer: stopping at step {step} ({why}): checkpoint step-{step} saved in {saved_in_s:.1f} s; "
        "waiting for the machine to stop",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    time.sleep(WAIT_S)
    raise SystemExit(f"trainer: told to stop at step {step} ({why}), and the machine did not stop")
