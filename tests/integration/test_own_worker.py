"""The worker `fleet run` starts for itself (workers.process.SpawnedWorker): stopped, it takes no task from
that moment (its heartbeat is gone, so the next `fleet run` on the home starts a worker of its own) and the
command goes on at once, while the worker ends by itself once Celery's pool has wound down."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from broker.constants import Stage
from workers.process import SpawnedWorker, missing_queues, wait_for_queues

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
        assert wait_for_queues(redis_client, 90), worker.log_path.read_text()[-3000:]
        worker.stop()
        assert sorted(missing_queues(redis_client)) == sorted(s.value for s in Stage)
        # Back before the worker's exit: Celery's warm shutdown takes seconds after the heartbeat is gone.
        assert worker.proc.poll() is None
        assert worker.proc.wait(60) == 0  # a warm shutdown, not killed
        assert "Warm shutdown" in worker.log_path.read_text()
    finally:
        if worker.proc.poll() is None:
            worker.proc.kill()
