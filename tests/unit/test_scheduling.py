"""tests.scheduling, the xdist scheduler that keeps trainings apart, driven as xdist drives it: two workers
that each run a test only once they hold the next one (or were told to end), in simulated time."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from xdist.remote import Producer
from xdist.workermanage import WorkerController

from tests import scheduling
from tests.conftest import TRAINING_MODULES, trains

TESTS = Path(__file__).resolve().parents[1]


class Config:
    def __init__(self, dist: str = "load") -> None:
        self.values: dict[str, Any] = {"tx": ["2*popen"], "dist": dist, "maxschedchunk": None}

    def getvalue(self, name: str) -> Any:
        return self.values[name]

    getoption = getvalue


class Worker:
    """What the scheduler sees of an xdist worker, and how the worker runs what it is sent."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.queue: list[int] = []
        self.running: tuple[int, float] | None = None  # (index, ends at)
        self.ran: list[int] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        assert not self.shutting_down
        self.queue.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True

    def can_start(self) -> bool:
        return self.running is None and (
            len(self.queue) >= 2 or (len(self.queue) == 1 and self.shutting_down)
        )


def simulate(collection: list[str], cost: dict[str, float]) -> tuple[list[Worker], float, int]:
    """Runs `collection` on two simulated workers; returns them, the wall time, and the most trainings that
    ever ran at once."""
    sched = scheduling.make(cast(pytest.Config, Config()), Producer("test"), trains)
    assert sched is not None
    workers = [Worker("gw0"), Worker("gw1")]
    nodes = cast(list[WorkerController], workers)
    for node in nodes:
        sched.add_node(node)
    for node in nodes:
        sched.add_node_collection(node, collection)
    sched.schedule()
    now, most = 0.0, 0
    while not all(w.shutting_down and not w.queue and w.running is None for w in workers):
        for w in workers:
            if w.can_start():
                index = w.queue[0]
                w.running = (index, now + cost[collection[index]])
        busy = [w for w in workers if w.running]
        assert busy, "no worker can start a test: the scheduler stalled"
        most = max(most, sum(trains(collection[w.running[0]]) for w in busy if w.running))
        w = min(busy, key=lambda w: w.running[1] if w.running else 0)
        assert w.running
        index, now = w.running
        w.running = None
        w.queue.remove(index)
        w.ran.append(index)
        sched.mark_test_complete(cast(WorkerController, w), index, 1.0)
    assert sched.tests_finished
    return workers, now, most


def suite() -> tuple[list[str], dict[str, float]]:
    """Three training modules (10 each) and four others (1 each), in collection order."""
    collection, cost = [], {}
    for module, n, each in [
        ("integration/test_broker.py", 4, 1.0),
        ("integration/test_e2e.py", 3, 10.0),
        ("integration/test_cli.py", 5, 1.0),
        ("integration/test_sweeps.py", 2, 10.0),
        ("integration/test_fake_runpod.py", 6, 1.0),
        ("integration/test_trainer_ray.py", 1, 10.0),
        ("faults/test_reaper.py", 3, 1.0),
    ]:
        for k in range(n):
            nodeid = f"tests/{module}::test_{k}"
            collection.append(nodeid)
            cost[nodeid] = each
    return collection, cost


def test_two_trainings_never_run_at_once_and_every_test_runs_once() -> None:
    collection, cost = suite()
    workers, wall, most = simulate(collection, cost)
    ran = Counter(i for w in workers for i in w.ran)
    assert sorted(ran) == list(range(len(collection))) and set(ran.values()) == {1}
    assert most == 1
    # The others run beside the trainings: the wall time is the trainings' (60) and a little, not 78.
    assert wall < 65, wall


def test_a_modules_tests_run_together_on_one_worker() -> None:
    """pytest makes a module's fixtures again when the module's tests are split or interleaved."""
    collection, cost = suite()
    workers, _, _ = simulate(collection, cost)
    for module in {scheduling.module_of(nodeid) for nodeid in collection}:
        holders = {w.name for w in workers for i in w.ran if scheduling.module_of(collection[i]) == module}
        assert len(holders) == 1, (module, holders)
    for w in workers:
        order = [scheduling.module_of(collection[i]) for i in w.ran]
        blocks = [m for k, m in enumerate(order) if k == 0 or order[k - 1] != m]
        assert len(blocks) == len(set(blocks)), (w.name, blocks)


def test_the_trainings_start_first_so_the_others_fill_in_beside_them() -> None:
    collection = [f"tests/integration/test_{m}.py::test_{k}" for m in ("cli", "broker") for k in range(5)]
    collection += [f"tests/integration/test_e2e.py::test_{k}" for k in range(3)]
    cost = {nodeid: 10.0 if trains(nodeid) else 1.0 for nodeid in collection}
    _, wall, _ = simulate(collection, cost)
    assert wall < 33, wall  # 30 of trainings; the others first would make it 35


def test_without_a_training_test_it_is_xdists_load_scheduling() -> None:
    collection = [f"tests/unit/test_x.py::test_{k}" for k in range(40)]
    workers, _, most = simulate(collection, dict.fromkeys(collection, 1.0))
    assert most == 0
    assert sorted(i for w in workers for i in w.ran) == list(range(40))
    assert all(len(w.ran) > 5 for w in workers)  # both worked


def test_other_dist_modes_are_left_to_xdist() -> None:
    assert scheduling.make(cast(pytest.Config, Config("loadfile")), Producer("test"), trains) is None


def test_every_training_module_named_exists() -> None:
    assert {m for m in TRAINING_MODULES if not (TESTS / m).is_file()} == set()
