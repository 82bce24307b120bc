"""Integration tests two at a time, trainings kept apart while there is other work (an xdist scheduler).

A test that trains end to end (a fleet, a Ray head, Ray Train's workers) keeps more than a core busy; the
rest (fake APIs, the broker, the CLI, most fault cases) waits more than it works. With `-n 2`,
tests/conftest.py hands xdist this scheduler, which weighs each test: LIGHT, TRAINS, or ALONE (a training
whose deadlines do not survive another beside it). While light tests are left, a worker holds a training
only when the other holds none, and the other takes the light tests beside it; once they are all taken, two
trainings may run at once, but an ALONE one never beside another training. The heaviest go first, so the
light tests fill in beside them. Each module's tests stay on the worker that started the module, so a
module's fixtures (a Ray head, a built model) are made once. With no training collected (the unit tests)
it is xdist's own load scheduling.

xdist runs a test only once it holds the next one (or is told to end), so every worker is kept two deep.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScheduling
from xdist.workermanage import WorkerController

LIGHT, TRAINS, ALONE = 0, 1, 2


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class TrainingApart(LoadScheduling):
    def __init__(self, config: pytest.Config, log: Producer, weight: Callable[[str], int]) -> None:
        super().__init__(config, log)
        self.weight = weight
        self.owner: dict[str, WorkerController] = {}
        self.apart = False

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is None:
            if not self._check_nodes_have_same_collection():
                self.log("**Different tests collected, aborting run**")
                return
            collection = next(iter(self.node2collection.values()))
            self.apart = any(self.weight(nodeid) > LIGHT for nodeid in collection)
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
            self.send(node, index)
        if not self.pending:
            node.shutdown()

    def check_all(self) -> None:
        for node in self.nodes:
            self.check_schedule(node)
        live = [node for node in self.nodes if not node.shutting_down]
        if self.pending and live and all(len(self.node2pending[node]) < 2 for node in live):
            # No worker can start a test (each waits for its next) and the rules give none: e.g. both hold a
            # training and only an ALONE one is left. The rules yield rather than hang the run.
            node = min(live, key=lambda n: len(self.node2pending[n]))
            self.send(node, self.pending[0])
            self.check_all()

    def send(self, node: WorkerController, index: int) -> None:
        self.pending.remove(index)
        self.node2pending[node].append(index)
        self.owner.setdefault(module_of(self.nodeid(index)), node)
        node.send_runtest_some([index])

    def nodeid(self, index: int) -> str:
        assert self.collection is not None
        return self.collection[index]

    def pick(self, node: WorkerController) -> int | None:
        """The next test for `node`, of those its weight allows beside what the others hold (see above): the
        heaviest first; its own modules' tests first, then a module nobody has started, then any."""
        held = max(
            (self.weight(self.nodeid(i)) for n, q in self.node2pending.items() if n is not node for i in q),
            default=LIGHT,
        )
        light_left = any(self.weight(self.nodeid(i)) == LIGHT for i in self.pending)

        def fits(w: int) -> bool:
            return w == LIGHT or held == LIGHT or (w == TRAINS and held == TRAINS and not light_left)

        allowed = [i for i in self.pending if fits(self.weight(self.nodeid(i)))]
        allowed.sort(key=lambda i: -self.weight(self.nodeid(i)))  # stable: collection order within a weight
        modules = {i: module_of(self.nodeid(i)) for i in allowed}
        return next(
            (i for i in allowed if self.owner.get(modules[i]) is node),
            next((i for i in allowed if modules[i] not in self.owner), allowed[0] if allowed else None),
        )


def make(config: pytest.Config, log: Producer, weight: Callable[[str], int]) -> TrainingApart | None:
    """The scheduler for `--dist load` (what `-n N` means); None leaves any other mode to xdist."""
    if config.getvalue("dist") != "load":
        return None
    return TrainingApart(config, log, weight)
