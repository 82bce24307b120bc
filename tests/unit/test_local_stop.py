"""providers.local.spawn.wait_gone: a killed process that is not our child and stays a zombie (its parent
does not read its exit status, as a killed head's reparented processes on a container without an init
that reaps) counts as ended at once; psutil.wait_procs waits on such a one until its timeout, which made
every local head's stop take 2.5 s instead of 0.6."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from providers.local.spawn import wait_gone

# A parent that starts a child which exits at once, prints its pid and never reads its exit status.
NEGLECTFUL = (
    "import subprocess, time; p = subprocess.Popen(['true']); print(p.pid, flush=True); time.sleep(60)"
)


def test_a_zombie_that_is_not_ours_counts_as_gone_at_once() -> None:
    parent = subprocess.Popen([sys.executable, "-c", NEGLECTFUL], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        zombie = psutil.Process(int(parent.stdout.readline()))
        deadline = time.monotonic() + 10
        while zombie.status() != psutil.STATUS_ZOMBIE:  # `true` ends within moments
            assert time.monotonic() < deadline, zombie.status()
            time.sleep(0.02)
        started = time.monotonic()
        assert wait_gone([zombie], timeout_s=5.0)
        assert time.monotonic() - started < 1.0
    finally:
        parent.kill()
        parent.wait()


def test_a_live_process_is_waited_for_until_the_timeout() -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        proc = psutil.Process(sleeper.pid)
        started = time.monotonic()
        assert not wait_gone([proc], timeout_s=0.5)
        assert time.monotonic() - started >= 0.5
        sleeper.kill()
        sleeper.wait()  # reaped: gone from the process table
        assert wait_gone([proc], timeout_s=0.5)
    finally:
        sleeper.kill()
        sleeper.wait()
