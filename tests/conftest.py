"""Fixtures shared by every layer: a real Redis server (the embedded one the CLI uses)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from xdist.remote import Producer

import providers.registry  # noqa: F401  (declares the clouds to jobs/ and core/, as every process's entry does)
from service.embedded import ensure_redis, stop_redis
from tests import scheduling

# The modules whose tests train (a trainer on Ray or in the test's process, 30-230 s on two cores), and of
# them those that must not run beside another training: node_ready's runs wait out a node setup's failing pip
# (past its 300 s with another training beside it), the run preempted twice is the longest (230 s of its
# 420), and the sweep trains two runs at once itself (with a third beside it, a local Ray head starved of CPU
# died under one of them: the run went on on a new node, but not as the test expects). Under `pytest -n 2`
# (the Makefile's test) tests.scheduling weighs each test by them.
TRAINING_MODULES = frozenset(
    {
        "integration/test_axolotl_node.py",
        "integration/test_bot.py",
        "integration/test_e2e.py",
        "integration/test_e2e_anycloud.py",
        "integration/test_e2e_axolotl.py",
        "integration/test_e2e_clouds.py",
        "integration/test_e2e_entry.py",
        "integration/test_e2e_hub.py",
        "integration/test_e2e_multinode.py",
        "integration/test_e2e_prepare.py",
        "integration/test_e2e_preemption.py",
        "integration/test_hub_checkpoints.py",
        "integration/test_node_ready.py",
        "integration/test_readme_recipes.py",
        "integration/test_sweeps.py",
        "integration/test_tracking.py",
        "integration/test_trainer_ray.py",
        "faults/test_cloud_runs.py",
        "faults/test_preemption.py",
        "faults/test_redis_restart.py",
        "faults/test_worker_kills.py",
    }
)
ALONE_MODULES = frozenset(
    {"integration/test_node_ready.py", "integration/test_e2e_preemption.py", "integration/test_sweeps.py"}
)


def weight(nodeid: str) -> int:
    """How a test id (`tests/integration/test_e2e.py::test_x[...]`) weighs in tests.scheduling."""
    module = scheduling.module_of(nodeid).removeprefix("tests/")
    if module in ALONE_MODULES:
        return scheduling.ALONE
    return scheduling.TRAINS if module in TRAINING_MODULES else scheduling.LIGHT


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> scheduling.TrainingApart | None:
    return scheduling.make(config, log, weight)


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
