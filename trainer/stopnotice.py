"""A stop the node was told of: its machine is being taken back (a spot machine preempted, a container
stopped), and the trainer has a short while to keep what it did.

Two ways in, one meaning: SIGTERM to the trainer's own process (a container's stop reaches it, or `ray job
stop`), which only the main thread can catch, and the node's notice file, `$FLEET_NODE_ROOT/stop-notice`,
which any process of the run can see (Ray Train's workers run in actors, where no signal handler can be
set), written by whatever learns of the stop first (the node's start script on SIGTERM, a vendor's notice).
A notice older than this trainer is a leftover of an earlier container on the same volume, never obeyed.

The builtin recipe asks after every optimizer step (every worker agrees: a collective): on a stop it saves
a checkpoint at that step, says so, and then waits (WAIT_S) to be killed with its machine rather than
ending the Ray job at once, so the fleet sees a lost node (and replaces it, resuming from the checkpoint),
not a failed run; a machine that stays (a local node, a stopped Ray job) sees the trainer end after it.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from trainer.progress import NODE_ROOT_ENV

NOTICE_FILE = "stop-notice"
# How long a stopped trainer waits for its machine to go before it ends itself: longer than a container's
# stop takes (docker's grace is 10 s), short enough that a trainer whose machine stays (a local node, a
# `ray job stop`) does not linger.
WAIT_S = 20.0


class StopNotice:
    """Whether this trainer was told to stop (module docstring)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        root = environ.get(NODE_ROOT_ENV)
        self.path = Path(root) / NOTICE_FILE if root else None
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


def wait_for_the_end(step: int, why: str, saved_in_s: float) -> None:
    """Say what was kept, then wait (WAIT_S) to be killed with the machine, and end (see the module)."""
    print(
        f"trainer: stopping at step {step} ({why}): checkpoint step-{step} saved in {saved_in_s:.1f} s; "
        "waiting for the machine to stop",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    time.sleep(WAIT_S)
    raise SystemExit(f"trainer: told to stop at step {step} ({why}), and the machine did not stop")
