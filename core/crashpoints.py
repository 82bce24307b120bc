"""Named crash points, for fault-injection tests only (tests/faults).

`crash_point(point)` ends the calling process at once when the environment variable FLEET_CRASH_AT names
that point: `os._exit(137)`, as a `kill -9` would, so no `except`, `finally` or atexit handler runs and
nothing is written to the ledger after it. The variable is read at each call (never at import), so a test
can set it in one worker's environment and leave it out of the next one's. Nothing in the fleet sets it;
unset, a crash point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import sys
from enum import StrEnum

CRASH_ENV = "FLEET_CRASH_AT"
CRASH_EXIT_CODE = 137  # what a shell reports for a process killed by SIGKILL (128 + 9)


class CrashPoint(StrEnum):
    """Where the fleet can be made to crash."""

    AFTER_CREATE_CALL = "after_create_call"  # provision: the provider's create returned, the ledger not told


def crash_point(point: CrashPoint) -> None:
    """Exit the process with 137 right here when FLEET_CRASH_AT is `point` (says so on stderr first)."""
    if os.environ.get(CRASH_ENV) == point.value:
        sys.stderr.write(f"fleet: crash point {point.value}: exiting with {CRASH_EXIT_CODE}\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)
