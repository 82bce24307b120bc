"""F7: a `cloud:` job's failover under faults, on the fake RunPod and vast.ai at once (stub nodes:
provisioning reaches RUNNING; nothing trains), through the fleet's own stage code (tests.faults.direct).

vast.ai's offer is the cheaper one, so every run goes there first. A node that never becomes ready is
left once FLEET_NODE_READY_TIMEOUT_S has passed since its offer was chosen: it is terminated (nothing stays
billing) and the run moves to RunPod under its next attempt's name. A create without a clear answer
(carried out after the client's timeout) is no reason to move on: the name is looked up until the instance
shows, and adopted, so the run never holds an instance on both clouds. A sweep whose children do not all fit
on one cloud spreads over both. Every run must reach RUNNING on one instance, end CANCELLED, and leave
nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from service.sweep_load import load_sweep
from service.sweeps import cancel_sweep, submit_sweep
from state.events import read_run
from state.stages import RunState
from tests.factories import light_job_file
from tests.fakes import FakeRunPod, FakeVastAI
from tests.faults.case import Case
from tests.faults.direct import DirectFleet, up

pytestmark = pytest.mark.faults

CLOUD_SECTION = (
    "cloud:\n  gpu: RTX-A5000\n  cloud_type: ALL\n  max_bid_per_gpu: 0.5\n  one_shot: true\n"
    "  pod_type: INTERRUPTABLE\n"
)
READY_TIMEOUT_S = 3.0


def both_clouds(
    case: Case, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **settings: Any
) -> tuple[FakeRunPod, FakeVastAI, DirectFleet]:
    """The case's two fake clouds (stub nodes) and its fleet on both."""
    runpod = case.cloud(FakeRunPod, tmp_path / "runpod", nodes="stub")
    vast = case.cloud(FakeVastAI, tmp_path / "vastai", nodes="stub")
    return (
        runpod,
        vast,
        DirectFleet(case, redis_url, tmp_path / "fleet", [runpod, vast], monkeypatch, **settings),
    )


def up_on_then_cancelled(case: Case, fleet: DirectFleet, tmp_path: Path, cloud: str) -> str:
    """Submit the cloud job, see it reach RUNNING on `cloud`, cancel it and let it end; the case's checks
    hold. The run's id."""
    run_id = fleet.submit(light_job_file(tmp_path / "job", CLOUD_SECTION))
    case.expect(run_id, RunState.CANCELLED)
    fleet.drive(run_id, until=up)
    run = fleet.ctx.ledger.get_run(run_id)
    assert run.state == RunState.PREPARING and run.provider == cloud, (run.state, run.failure_message)
    fleet.cancel(run_id)
    fleet.drive(run_id, until=lambda r: False)
    case.check()
    return run_id


def test_a_node_never_ready_is_ended_and_the_run_moves_to_the_other_cloud_in_process(
    case: Case,
    redis_client: redis.Redis[str],
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runpod, vast, fleet = both_clouds(
        case, redis_url, tmp_path, monkeypatch, node_ready_timeout_s=READY_TIMEOUT_S
    )
    vast.add_faults([{"op": "create", "kind": "stuck"}])  # made, and never starts
    run_id = up_on_then_cancelled(case, fleet, tmp_path, "runpod")

    events = [e for _, e in read_run(fleet.ctx.redis, run_id)]
    (left,) = [e.data.wire() for e in events if e.type.value == "offer.left"]
    assert left["cloud"] == "vastai" and f"not ready after {READY_TIMEOUT_S:.0f} s" in left["why"]
    assert vast.state()["most_live"] == {f"tf-{run_id}-1": 1} and vast.state()["instances"] == []
    assert runpod.state()["most_live"] == {f"tf-{run_id}-2": 1} and runpod.state()["instances"] == []
    ended = [e.data.wire()["instance"] for e in events if e.type.value == "instance.terminated"]
    assert ended == [f"tf-{run_id}-1", f"tf-{run_id}-2"]  # the stuck one as the run left it


def test_a_create_without_a_clear_answer_is_adopted_not_left_in_process(
    case: Case,
    redis_client: redis.Redis[str],
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runpod, vast, fleet = both_clouds(case, redis_url, tmp_path, monkeypatch)
    fleet.client_timeout("vastai", 1.0)
    vast.add_faults([{"op": "create", "kind": "timeout", "delay": 3.0}])  # made 3 s late, after the timeout
    run_id = up_on_then_cancelled(case, fleet, tmp_path, "vastai")

    kinds = [e.type.value for _, e in read_run(fleet.ctx.redis, run_id)]
    # The create had no clear answer: the name was looked up until the late instance showed, and adopted.
    assert "instance.adopted" in kinds and "offer.left" not in kinds, kinds
    assert vast.state()["requests"]["create"] == 1 and "create" not in runpod.state()["requests"]


def test_a_sweep_spreads_over_the_clouds_when_one_cannot_hold_it_in_process(
    case: Case,
    redis_client: redis.Redis[str],
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two children at once and one A5000 on vast.ai: the first rents it, the second finds it taken (the
    offer is no longer listed) and rents RunPod's, the next cheapest."""
    runpod, vast, fleet = both_clouds(case, redis_url, tmp_path, monkeypatch)
    job = light_job_file(tmp_path / "job", CLOUD_SECTION)
    job.write_text(job.read_text() + "sweep:\n  max_parallel: 2\n  grid:\n    learning_rate: [0.01, 0.02]\n")
    sweep = submit_sweep(fleet.fleet, load_sweep(job))
    for run_id in sweep.runs:
        case.expect(run_id, RunState.CANCELLED)
        fleet.drive(run_id, until=up)
    placed = {fleet.ctx.ledger.get_run(run_id).provider.value for run_id in sweep.runs}
    assert placed == {"vastai", "runpod"}
    cancel_sweep(fleet.fleet, sweep.sweep_id)
    for run_id in sweep.runs:
        fleet.drive(run_id, until=lambda r: False)
    case.check()
    assert vast.state()["requests"]["create"] == 1 and runpod.state()["requests"]["create"] == 1
