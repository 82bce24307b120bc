"""`fleet health PART`, docker-compose's healthchecks, against the real processes: a `fleet up` (worker and
beat, the reaper every 2 s) and `fleet flower`, each checked while up and after it stopped (the `home`
fixture stops the embedded Redis they started)."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from state.keys import REAP_SEEN
from tests.integration.fleetproc import Worker, fleet, fleet_env, redis_of, wait_until
from tests.integration.flowerproc import flower

pytestmark = pytest.mark.integration


def test_health_of_a_worker_and_beat_while_up_and_after(home: Path, tmp_path: Path) -> None:
    env = fleet_env(home)
    before = fleet(env, "health", "worker", timeout=60)
    assert before.returncode == 1 and "no worker on" in before.stderr, before.stderr[-2000:]
    never = fleet(env, "health", "beat", timeout=60)
    assert never.returncode == 1 and "the periodic reaper last ran never" in never.stderr
    worker = Worker(env, tmp_path / "up.log")
    try:

        def checked() -> subprocess.CompletedProcess[str] | None:
            done = fleet(env, "health", "worker", timeout=60)
            return done if done.returncode == 0 else None

        up = wait_until(checked, 90, "a worker")
        assert "worker serves finalize, prepare, provision, reap, train" in up.stdout
        wait_until(lambda: fleet(env, "health", "beat", timeout=60).returncode == 0, 60, "the reaper to run")
    finally:
        worker.stop()
    gone = fleet(env, "health", "worker", timeout=60)
    assert gone.returncode == 1, gone.stdout  # its heartbeat went with it
    redis_of(home).set(REAP_SEEN, f"{time.time() - 600:.3f}")  # as a beat (or reap worker) down 10 min
    stale = fleet(env, "health", "beat", timeout=60)
    assert stale.returncode == 1 and re.search(
        r"the periodic reaper last ran 6\d\d s ago \(every 2 s\)", stale.stderr
    )


def test_health_of_flower(home: Path, tmp_path: Path) -> None:
    env = fleet_env(home, FLOWER_BASIC_AUTH="ops:secret-pass")
    with flower(env, tmp_path / "flower.log") as at:
        port = at.url.rsplit(":", 1)[1]
        assert fleet(env, "health", "flower", "--port", port, timeout=60).returncode == 0
    down = fleet(env, "health", "flower", "--port", port, timeout=60)
    assert down.returncode == 1 and f"flower does not answer on 127.0.0.1:{port}" in down.stderr
