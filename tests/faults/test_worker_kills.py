"""F1: the worker (`fleet up`: main process, pool children, beat) killed -9 in the middle of every stage.

One run on a local Ray head takes seven kills: in provision (the node asked for), in prepare (its fetch job
submitted), three times in train (its job submitted, after a step, after a checkpoint), and twice in
finalize (its push to the Hub running; the push recorded, the node being terminated). Each time a new
worker takes the run over once its chain of tasks is found dead. The events go to Discord meanwhile
(`fleet notify`), so the canaries are looked for there too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from state.keys import PARKED
from state.models import InstanceState
from state.stages import RunState
from tests.factories import light_job_file
from tests.fakes import FakeDiscord
from tests.faults.case import Case
from tests.faults.live import LiveFleet

pytestmark = [pytest.mark.faults, pytest.mark.faults_full]
REPO_ID = "tester/tiny-faults"


def in_stage(stage: str) -> tuple[str, object]:
    return "stage.started", lambda e: e["data"].get("stage") == stage


# (label, event kind to wait for, filter): each kill lands right after the run's first such event.
KILL_POINTS: list[tuple[str, str, object]] = [
    ("provision:instance.requested", "instance.requested", None),
    ("prepare:prepare.submitted", "prepare.submitted", None),
    ("train:train.submitted", "train.submitted", None),
    ("train:train.step", "train.step", None),
    ("train:train.checkpoint", "train.checkpoint", None),
    ("finalize:stage.started", *in_stage("finalize")),
    ("finalize:finalize.pushed", "finalize.pushed", None),
]


def test_worker_killed_in_every_stage(case: Case, tmp_path: Path) -> None:
    fleet = LiveFleet(case, tmp_path / "fleet")
    discord = case.stack.enter_context(FakeDiscord())
    fleet.notifier(discord)
    job = light_job_file(tmp_path / "job", extra=f"hub_model_id: {REPO_ID}\n")
    worker = fleet.worker()
    run_id = fleet.enqueue(job)
    case.expect(run_id, RunState.SUCCEEDED)
    parked_at_kill = 0  # kills while the run waited parked: the next worker's watcher wakes it, no kick
    for n, (label, kind, where) in enumerate(KILL_POINTS, start=1):
        fleet.wait_event(run_id, kind, where=where)  # type: ignore[arg-type]
        parked = fleet.redis.hexists(PARKED, run_id)
        fleet.kill(worker, label)
        parked_at_kill += parked
        state = fleet.run(run_id).state.value + " parked" * parked
        case.notes[f"kill {n}"] = f"{label}, run {state} at the kill"
        worker = fleet.worker()
    case.check()

    evs = fleet.events(run_id)
    kinds = [e["type"] for e in evs]
    assert len({e["id"] for e in evs}) == len(evs)  # no event written twice
    assert kinds.count("instance.requested") == 1  # one node for the run, never a second
    for once in ("prepare.submitted", "train.submitted", "train.finished", "finalize.pushed"):
        assert kinds.count(once) == 1, (once, kinds)
    assert kinds.count("run.succeeded") == 1
    steps = [e["data"]["step"] for e in evs if e["type"] == "train.step"]
    assert steps == sorted(set(steps))  # each step relayed once, in order
    # The reaper took over the dead chains (a chain whose last task was acked before the kill may be
    # redelivered by Celery instead: one kill's slack); a parked run's chain was the dead watcher's.
    assert kinds.count("run.kicked") + parked_at_kill >= len(KILL_POINTS) - 1, (parked_at_kill, kinds)
    # The push took effect once: the repo's creation and one upload commit.
    (repo,) = fleet.hub.state()["repos"]
    assert repo["id"] == REPO_ID and len(repo["commits"]) == 2, repo["commits"]
    # The node was terminated once (the kill during its terminate left that to the reaper's confirmation
    # or the next finalize task, never a second node or a second terminate event).
    assert kinds.count("instance.terminated") <= 1, kinds
    record = fleet.ledger.get_instance(f"tf-{run_id}-1")
    assert record is not None and record.state == InstanceState.TERMINATED, record
    # The notifier did post the run's events (so I4 looked at real messages).
    assert any(run_id in json.dumps(m) for m in discord.state()["channels"].values())
