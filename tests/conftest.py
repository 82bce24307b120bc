"""Fixtures shared by every layer: a real Redis server (the embedded one the CLI uses)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from service.embedded import ensure_redis, stop_redis

# The modules whose tests train end to end (a fleet, Ray heads and a trainer each, 60-160 s on two cores).
# Under `--dist loadgroup` they run one after another on one xdist worker, never two trainings at once,
# while the other worker takes the rest (fake APIs, the broker, the fault cases) a module at a time, so a
# module's fixtures (a Ray head, a built model) are made once: see the Makefile's test.
TRAINING_MODULES = frozenset(
    {
        "test_bot.py",
        "test_e2e.py",
        "test_e2e_axolotl.py",
        "test_e2e_clouds.py",
        "test_e2e_entry.py",
        "test_e2e_hub.py",
        "test_e2e_multinode.py",
        "test_e2e_preemption.py",
        "test_sweeps.py",
        "test_trainer_ray.py",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent.name in ("integration", "faults"):
            group = "training" if item.path.name in TRAINING_MODULES else item.path.stem
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server for the whole session (AOF on), stopped at the end."""
    home = tmp_path_factory.mktemp("redis-home")
    url = ensure_redis(home)
    yield url
    stop_redis(home)


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis[str]]:
    """A client on an emptied database."""
    client: redis.Redis[str] = redis.Redis.from_url(redis_url, decode_responses=True)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def fleet_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    return home
