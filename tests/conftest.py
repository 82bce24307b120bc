"""Fixtures shared by every layer: a real Redis server (the embedded one the CLI uses)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from service.embedded import ensure_redis, stop_redis


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
