"""core.crashpoints: a named point ends the process as kill -9 would, only when FLEET_CRASH_AT names it."""

from __future__ import annotations

import os
import subprocess
import sys

from core.crashpoints import CRASH_ENV, CRASH_EXIT_CODE, CrashPoint
from tests.factories import REPO_ROOT

PROGRAM = (
    "import atexit\n"
    "from core.crashpoints import CrashPoint, crash_point\n"
    "atexit.register(lambda: print('atexit ran'))\n"
    "try:\n"
    "    crash_point(CrashPoint.AFTER_CREATE_CALL)\n"
    "finally:\n"
    "    print('finally ran')\n"
    "print('went on')\n"
)


def run(crash_at: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    if crash_at is not None:
        env[CRASH_ENV] = crash_at
    return subprocess.run(
        [sys.executable, "-c", PROGRAM], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )


def test_the_named_point_exits_at_once_with_nothing_run_after_it() -> None:
    done = run(CrashPoint.AFTER_CREATE_CALL.value)
    assert done.returncode == CRASH_EXIT_CODE == 137
    assert done.stdout == ""  # no finally, no atexit: as a kill -9
    assert "fleet: crash point after_create_call: exiting with 137" in done.stderr


def test_unset_or_another_point_goes_on() -> None:
    for crash_at in (None, "", "before_something_else"):
        done = run(crash_at)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["finally ran", "went on", "atexit ran"]
