"""train.pending on the fleet: the trainer's PENDING lines as events, their one-line and Discord renderings,
and the failure a given-up wait becomes (workers.stages.train)."""

from __future__ import annotations

import json
from typing import Any

from bot.render import separate_message
from service.describe import describe
from state.payloads import Event, EventType, TrainPending
from trainer import lines, progress
from trainer.placement import Demand, NodeRoom, pending_line, place
from workers.stages.train import _EVENT_OF, gave_up, unplaced


def line(report: int, waited: float, gave: bool) -> dict[str, Any]:
    """A PENDING line as trainer.placement writes it: 2 workers of 1 CPU against a 1-CPU node."""
    nodes = [NodeRoom("n1", {"CPU": 1, "memory": 1e9}, {"CPU": 1})]
    return lines.fields(pending_line(place(Demand(2, {"CPU": 1}), nodes), nodes, waited, 600, report, gave))


def log_of(*records: dict[str, Any]) -> str:
    text = "".join(f"(pid=1) {progress.MARKER}{json.dumps({'kind': 'pending', **r})}\n" for r in records)
    return "starting\n" + text + "trainer: error: Ray cannot place the training workers: ...\n"


def event(data: dict[str, Any]) -> Event:
    return Event(id="r-5", type=EventType.TRAIN_PENDING, run_id="r", data=data)


def test_a_pending_line_is_a_train_pending_event() -> None:
    assert _EVENT_OF[progress.Kind.PENDING] == EventType.TRAIN_PENDING
    pending = event(line(1, 0, False)).data
    assert isinstance(pending, TrainPending)
    assert pending.workers == 2 and pending.per_worker == {"CPU": 1} and pending.nodes[0].total == {"CPU": 1}


def test_a_given_up_wait_fails_naming_the_demand_and_the_cluster() -> None:
    assert gave_up(log_of(line(1, 0, False))) is None  # still waiting: not this failure
    pending = gave_up(log_of(line(1, 0, False), line(2, 600.2, True)))
    assert pending is not None
    assert unplaced(pending) == (
        "Ray could not place the training workers in 600.2 s: 2 x {CPU: 1} asked, the cluster's nodes hold "
        "1 of the 2 workers' {CPU: 1} even when idle; the cluster has 1 node (free/total): {CPU: 1/1}"
    )


def test_the_cli_line_shows_the_demand_the_cluster_and_the_wait() -> None:
    text = describe(event(line(2, 30, False)))
    assert text.endswith(
        'train.pending          demand="2 x {CPU: 1}" cluster="1 node (free/total): {CPU: 1/1}" '
        "waited_s=30/600"
    )


def test_discord_says_when_the_wait_begins_only() -> None:
    first = separate_message(event(line(1, 0.1, False)))
    assert first == (
        "⏳ Run r: Ray cannot place its training workers yet: 2 x {CPU: 1} asked, the cluster's nodes hold 1 "
        "of the 2 workers' {CPU: 1} even when idle; the cluster has 1 node (free/total): {CPU: 1/1}. "
        "Waiting for nodes (at most 600 s)"
    )
    assert separate_message(event(line(2, 30, False))) is None
    assert separate_message(event(line(3, 600, True))) is None  # run.failed says it
