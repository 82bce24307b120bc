"""Integration tests two at a time, never two trainings at once (an xdist scheduler).

A test that trains end to end (a fleet, a Ray head, Ray Train's workers) keeps most of two cores busy:
plain `pytest -n 2` ran two at once and pushed each past its deadlines. The rest (fake APIs, the broker,
the CLI, the fault cases) waits more than it works. So with `-n 2`, tests/conftest.py hands xdist this
scheduler: a training test goes to a worker only while no other worker holds one, the other worker takes
the rest beside it, and each module's tests stay on the worker that started the module, so a module's
fixtures (a Ray head, a built model) are made once. With no training test collected (the unit tests) it
is xdist's own load scheduling.

xdist runs a test only once it holds the next one (or is told to end), so every worker is kept two deep.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScheduling
from xdist.workermanage import WorkerController


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class TrainingApart(LoadScheduling):
    def __init__(self, config: pytest.Config, log: Producer, trains: Callable[[str], bool]) -> None:
        super().__init__(config, log)
        self.trains = trains
        self.owner: dict[str, WorkerController] = {}
        self.apart = False

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is None:
            if not self._check_nodes_have_same_collection():
                self.log("**Different tests collected, aborting run**")
                return
            collection = next(iter(self.node2collection.values()))
            self.apart = any(self.trains(nodeid) for nodeid in collection)
            if not self.apart:
                super().schedule()
                return
            self.collection = collection
            self.pending[:] = range(len(collection))
        self.check_all()

    def mark_test_complete(self, node: WorkerController, item_index: int, duration: float = 0) -> None:
        if not self.apart:
            super().mark_test_complete(node, item_index, duration)
            return
        self.node2pending[node].remove(item_index)
        self.check_all()

    def mark_test_pending(self, item: str) -> None:
        if not self.apart:
            super().mark_test_pending(item)
            return
        assert self.collection is not None
        self.pending.insert(0, self.collection.index(item))
        self.check_all()

    def remove_node(self, node: WorkerController) -> str | None:
        for module in [m for m, owner in self.owner.items() if owner is node]:
            del self.owner[module]
        crashed = super().remove_node(node)
        if self.apart:
            self.check_all()
        return crashed

    def check_schedule(self, node: WorkerController, duration: float = 0) -> None:
        if not self.apart:
            super().check_schedule(node, duration)
            return
        if node.shutting_down:
            return
        while len(self.node2pending[node]) < 2 and (index := self.pick(node)) is not None:
            self.pending.remove(index)
            self.node2pending[node].append(index)
            self.owner.setdefault(module_of(self.nodeid(index)), node)
            node.send_runtest_some([index])
        if not self.pending:
            node.shutdown()

    def check_all(self) -> None:
        for node in self.nodes:
            self.check_schedule(node)

    def nodeid(self, index: int) -> str:
        assert self.collection is not None
        return self.collection[index]

    def pick(self, node: WorkerController) -> int | None:
        """The next test for `node`: none that trains while another worker holds one; one that trains before
        one that does not; its own modules' tests first, then a module nobody has started, then any."""
        elsewhere = [i for other, queue in self.node2pending.items() if other is not node for i in queue]
        training_elsewhere = any(self.trains(self.nodeid(i)) for i in elsewhere)
        allowed = [i for i in self.pending if not (training_elsewhere and self.trains(self.nodeid(i)))]
        allowed.sort(key=lambda i: not self.trains(self.nodeid(i)))  # stable: collection order within each
        modules = {i: module_of(self.nodeid(i)) for i in allowed}
        return next(
            (i for i in allowed if self.owner.get(modules[i]) is node),
            next((i for i in allowed if modules[i] not in self.owner), allowed[0] if allowed else None),
        )


def make(config: pytest.Config, log: Producer, trains: Callable[[str], bool]) -> TrainingApart | None:
    """The scheduler for `--dist load` (what `-n N` means); None leaves any other mode to xdist."""
    if config.getvalue("dist") != "load":
        return None
    return TrainingApart(config, log, trains)
