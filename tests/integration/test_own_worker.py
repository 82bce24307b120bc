"""The worker `fleet run` starts for itself (workers.process.SpawnedWorker): stopped, it takes no task from
that moment (its heartbeat is gone, so the next `fleet run` on the home starts a worker of its own) and the
command goes on at once, while the worker ends by itself once Celery's pool has wound down."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from state.stages import Stage
from tests.integration.fleetproc import wait_until
from workers.process import SpawnedWorker

pytestmark = pytest.mark.integration


def test_a_stopped_worker_serves_nothing_at_once_and_ends_by_itself(
    redis_client: redis.Redis[str], redis_url: str, fleet_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_HOME", str(fleet_home))
    settings = fleet_home / "settings.yml"
    settings.write_text("{}\n")
    monkeypatch.setenv("FLEET_SETTINGS_FILE", str(settings))
    worker = SpawnedWorker(redis_client, redis_url, fleet_home / "logs")
    try:
        # Its own heartbeat, not any worker's: one an earlier test left winding down on this Redis may still
        # beat for a while (a CI run once saw every queue served after stop() for that reason).
        wait_until(lambda: redis_client.exists(worker.key), 90, f"its heartbeat; log: {worker.log_path}", 0.2)
        assert {s.value for s in Stage} <= set(json.loads(redis_client.get(worker.key) or "{}")["queues"])
        worker.stop()
        assert not redis_client.exists(worker.key)  # what the next `fleet run` reads: no longer served here
        # Back before the worker's exit: Celery's warm shutdown takes seconds after the heartbeat is gone.
        assert worker.proc.poll() is None
        assert worker.proc.wait(60) == 0  # a warm shutdown, not killed
        assert "Warm shutdown" in worker.log_path.read_text()
    finally:
        if worker.proc.poll() is None:
            worker.proc.kill()
