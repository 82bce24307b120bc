"""tests.scheduling, the xdist scheduler that keeps trainings apart, driven as xdist drives it: two workers
that each run a test only once they hold the next one (or were told to end), in simulated time. Test ids
are weighed by tests/conftest.py's own rule."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from xdist.remote import Producer
from xdist.workermanage import WorkerController

from tests import scheduling
from tests.conftest import ALONE_MODULES, TRAINING_MODULES, weight

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


@dataclass
class Ran:
    workers: list[Worker]
    wall: float
    most: int  # the most trainings that ran at once
    paired_early: bool  # two ran at once while a light test was still waiting to start
    alone_paired: bool  # an ALONE test ran beside another training


def simulate(collection: list[str], cost: dict[str, float]) -> Ran:
    sched = scheduling.make(cast(pytest.Config, Config()), Producer("test"), weight)
    assert sched is not None
    workers = [Worker("gw0"), Worker("gw1")]
    nodes = cast(list[WorkerController], workers)
    for node in nodes:
        sched.add_node(node)
    for node in nodes:
        sched.add_node_collection(node, collection)
    sched.schedule()
    now, ran = 0.0, Ran(workers, 0.0, 0, False, False)
    started: set[int] = set()
    while not all(w.shutting_down and not w.queue and w.running is None for w in workers):
        for w in workers:
            if w.can_start():
                index = w.queue[0]
                w.running = (index, now + cost[collection[index]])
                started.add(index)
        busy = [w.running[0] for w in workers if w.running]
        assert busy, "no worker can start a test: the scheduler stalled"
        weights = [weight(collection[i]) for i in busy]
        training = sum(x > scheduling.LIGHT for x in weights)
        ran.most = max(ran.most, training)
        if training == 2:
            waiting = set(range(len(collection))) - started
            ran.paired_early |= any(weight(collection[i]) == scheduling.LIGHT for i in waiting)
            ran.alone_paired |= scheduling.ALONE in weights
        w = min((w for w in workers if w.running), key=lambda w: w.running[1] if w.running else 0)
        assert w.running
        index, now = w.running
        w.running = None
        w.queue.remove(index)
        w.ran.append(index)
        sched.mark_test_complete(cast(WorkerController, w), index, 1.0)
    assert sched.tests_finished
    ran.wall = now
    return ran


def suite() -> tuple[list[str], dict[str, float]]:
    """Three training modules (10 each) and four others (1 each), in collection order."""
    collection, cost = [], {}
    for module, n, each in [
        ("integration/test_broker.py", 4, 1.0),
        ("integration/test_e2e.py", 3, 10.0),
        ("integration/test_cli.py", 5, 1.0),
        ("integration/test_bot.py", 2, 10.0),
        ("integration/test_fake_runpod.py", 6, 1.0),
        ("integration/test_trainer_ray.py", 1, 10.0),
        ("faults/test_reaper.py", 3, 1.0),
    ]:
        for k in range(n):
            nodeid = f"tests/{module}::test_{k}"
            collection.append(nodeid)
            cost[nodeid] = each
    return collection, cost


def test_trainings_run_apart_while_light_tests_are_left_and_every_test_runs_once() -> None:
    collection, cost = suite()
    ran = simulate(collection, cost)
    done = Counter(i for w in ran.workers for i in w.ran)
    assert sorted(done) == list(range(len(collection))) and set(done.values()) == {1}
    assert not ran.paired_early
    # The light tests (18) run beside the trainings (60): not one after the other (78).
    assert ran.wall < 65, ran.wall


def test_once_the_light_tests_are_taken_two_trainings_run_at_once_but_never_beside_an_alone_one() -> None:
    collection = [f"tests/integration/test_cli.py::test_{k}" for k in range(4)]
    collection += [f"tests/integration/test_{m}.py::test_{k}" for m in ("e2e", "bot") for k in range(3)]
    collection += ["tests/integration/test_node_ready.py::test_0"]
    cost = {nodeid: 10.0 if weight(nodeid) else 1.0 for nodeid in collection}
    ran = simulate(collection, cost)
    assert ran.most == 2 and not ran.paired_early and not ran.alone_paired
    assert ran.wall < 50, ran.wall  # 70 of trainings, one at a time


def test_a_worker_that_the_rules_leave_waiting_gets_a_test_rather_than_hang_the_run() -> None:
    """Both workers hold one training each (each waits for its next before it starts it) and only an ALONE
    test is left, which the rules give neither (a state a crashed worker's tests put back can make). The
    scheduler yields rather than hang."""
    collection = ["tests/integration/test_e2e.py::test_0", "tests/integration/test_e2e.py::test_1"]
    collection += ["tests/integration/test_sweeps.py::test_0"]
    sched = scheduling.make(cast(pytest.Config, Config()), Producer("test"), weight)
    assert sched is not None
    workers = [Worker("gw0"), Worker("gw1")]
    for node in cast(list[WorkerController], workers):
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    sched.collection, sched.apart, sched.pending = collection, True, [2]
    for k, node in enumerate(cast(list[WorkerController], workers)):
        sched.node2pending[node] = [k]
    sched.check_all()
    assert sorted(len(w.queue) for w in workers) == [0, 1]  # the ALONE test went to one of them
    assert sched.pending == []


def test_a_modules_tests_run_together_on_one_worker() -> None:
    """pytest makes a module's fixtures again when the module's tests are split or interleaved."""
    collection, cost = suite()
    workers = simulate(collection, cost).workers
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
    cost = {nodeid: 10.0 if weight(nodeid) else 1.0 for nodeid in collection}
    assert simulate(collection, cost).wall < 33  # 30 of trainings; the others first would make it 35


def test_without_a_training_test_it_is_xdists_load_scheduling() -> None:
    collection = [f"tests/unit/test_x.py::test_{k}" for k in range(40)]
    ran = simulate(collection, dict.fromkeys(collection, 1.0))
    assert ran.most == 0
    assert sorted(i for w in ran.workers for i in w.ran) == list(range(40))
    assert all(len(w.ran) > 5 for w in ran.workers)  # both worked


def test_other_dist_modes_are_left_to_xdist() -> None:
    assert scheduling.make(cast(pytest.Config, Config("loadfile")), Producer("test"), weight) is None


def test_every_module_named_exists_and_an_alone_one_trains() -> None:
    assert {m for m in TRAINING_MODULES if not (TESTS / m).is_file()} == set()
    assert ALONE_MODULES <= TRAINING_MODULES
