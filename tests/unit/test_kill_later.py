"""workers.process.kill_group_later: what bounds a `fleet run` worker's wind-down after fleet run returned
(SpawnedWorker.stop): the group is killed once its time is up, and left alone when its leader ended."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import psutil

from workers.process import kill_group_later

SLEEP = "import time; time.sleep(60)"
CHILD = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {SLEEP!r}]); {SLEEP}"


def _group() -> tuple[subprocess.Popen[bytes], psutil.Process]:
    """A leader in a session of its own with one child (a worker and its pool), both asleep."""
    leader = subprocess.Popen([sys.executable, "-c", CHILD], start_new_session=True)
    deadline = time.monotonic() + 10
    while not (children := psutil.Process(leader.pid).children()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children, "the leader started no child"
    return leader, children[0]


def test_a_group_still_there_when_its_time_is_up_is_killed_whole() -> None:
    leader, child = _group()
    try:
        kill_group_later(leader.pid, 0.5)
        assert leader.poll() is None  # not at once: it has its time
        assert leader.wait(10) == -9
        child.wait(10)  # the pool child went with it
    finally:
        leader.kill()
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def test_a_leader_that_ended_in_time_leaves_nothing_to_kill() -> None:
    leader, child = _group()
    try:
        kill_group_later(leader.pid, 1.0)
        leader.terminate()
        assert leader.wait(5) == -15
        time.sleep(1.6)  # past the watchdog's time: it saw the leader end and killed nothing
        assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
