"""F4: interruptible nodes preempted mid-run, on the fake RunPod and vast.ai (whose instances are real local
Ray heads). The fake takes the instance away at a chosen moment (RunPod: EXITED; vast.ai: outbid,
`stopped`) and stops its head. The run must end SUCCEEDED on later nodes, resumed from the newest
checkpoint on the (fake) hub, with each preemption an event and no second live node of one attempt.

Points: while the node is still starting (provision), while the fetch job runs (prepare), and in training
after the first checkpoint, in the middle and just before the end, with several preemptions in one run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from state.stages import RunState
from tests.factories import light_job_file
from tests.fakes import FakeRunPod, FakeVastAI
from tests.faults.canaries import CANARIES
from tests.faults.case import Case
from tests.faults.live import Event, LiveFleet
from tests.integration.fleetproc import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.faults_full]
SECTIONS = {
    "runpod": (
        "runpod:\n  gpu: NVIDIA RTX A5000\n  max_bid_per_gpu: 0.5\n  pod_type: INTERRUPTABLE\n"
        "  max_preemptions: 5\n"  # three preemptions, more than the default two
    ),
    "vastai": (
        "vastai:\n  gpu: RTX_A5000\n  max_bid_per_gpu: 0.5\n  cloud_type: ALL\n  pod_type: INTERRUPTABLE\n"
        "  max_preemptions: 5\n  min_vcpu_count: 8\n  min_memory_in_gb: 29\n"
    ),
}
# Checkpoints every 10 of the 180 steps, each pushed to the hub, so that a new node goes on from there.
EXTRA = "hub_model_id: tester/preempted\nhub_strategy: checkpoint\n"
TOTAL_STEPS = 180
Point = tuple[str, Callable[[list[Event]], bool]]


def after(kind: str, where: Callable[[Event], bool] = lambda e: True) -> Callable[[list[Event]], bool]:
    """True once the events of the current node (since the last preemption) hold one of `kind`."""

    def reached(evs: list[Event]) -> bool:
        lost = [i for i, e in enumerate(evs) if e["type"] == "run.preempted"]
        current = evs[lost[-1] + 1 :] if lost else evs
        return any(e["type"] == kind and where(e) for e in current)

    return reached


def at_step(step: int) -> Callable[[list[Event]], bool]:
    return after("train.checkpoint", lambda e: int(e["data"].get("step", 0)) >= step)


# (label, moment) per preemption of one run
PLANS: dict[str, list[Point]] = {
    "starting_and_fetching": [
        ("provision:instance.requested", after("instance.requested")),
        ("prepare:prepare.submitted", after("prepare.submitted")),
    ],
    "train_first_mid_last": [
        ("train:first checkpoint", after("train.checkpoint")),
        ("train:mid", at_step(TOTAL_STEPS // 2)),
        ("train:last-1", at_step(TOTAL_STEPS - 20)),
    ],
}
QUICK: set[tuple[str, str]] = set()
CASES = [
    pytest.param(vendor, plan, marks=() if (vendor, plan) in QUICK else pytest.mark.faults_full)
    for vendor, plan in (
        ("runpod", "train_first_mid_last"),
        ("vastai", "train_first_mid_last"),
        ("runpod", "starting_and_fetching"),
    )
]


@pytest.mark.parametrize(("vendor", "plan"), CASES)
def test_a_run_preempted_at_several_points_resumes_and_succeeds(
    case: Case, tmp_path: Path, vendor: str, plan: str
) -> None:
    fake_class: Any = {"runpod": FakeRunPod, "vastai": FakeVastAI}[vendor]
    key = CANARIES["RUNPOD_API_KEY" if vendor == "runpod" else "VAST_API_KEY"]
    fake = case.stack.enter_context(fake_class(api_key=key, home=tmp_path / "fake", nodes="ray"))
    fleet = LiveFleet(case, tmp_path / "fleet", [fake], FLEET_PREEMPT_BACKOFF_S="1")
    job = light_job_file(tmp_path / "job", SECTIONS[vendor], extra=EXTRA)
    job.write_text(job.read_text().replace("save_steps: 40", "save_steps: 10"))
    fleet.worker()
    run_id = fleet.enqueue(job)
    case.expect(run_id, RunState.SUCCEEDED)
    points = PLANS[plan]
    for n, (label, reached) in enumerate(points, start=1):
        wait_until(lambda r=reached: r(fleet.events(run_id)), 300, label, every=0.2)
        (live,) = [i for i in fake.state()["instances"] if str(i["name"]).startswith(f"tf-{run_id}-")]
        assert live["name"] == f"tf-{run_id}-{n}", live
        assert fake.preempt(str(live["id"])), live
        case.inject("preemption")
        case.notes[f"preemption {n}"] = f"{label} ({live['name']})"
        wait_until(lambda n=n: fleet.kinds(run_id).count("run.preempted") == n, 120, f"preemption {n} seen")
    case.check()

    evs = fleet.events(run_id)
    kinds = [e["type"] for e in evs]
    lost = [e["data"] for e in evs if e["type"] == "run.preempted"]
    assert [p["instance"] for p in lost] == [f"tf-{run_id}-{n}" for n in range(1, len(points) + 1)]
    assert kinds.count("instance.requested") + kinds.count("instance.adopted") == len(points) + 1
    assert "train.restarted" not in kinds  # preemptions do not use the run's restarts
    assert kinds.count("train.finished") == 1 and kinds.count("run.succeeded") == 1
    run = fleet.run(run_id)
    assert run.preemptions == len(points) and run.attempt == len(points) + 1
    # Every node that trained after a checkpoint went on from the newest one the hub had by then.
    for i, event in enumerate(evs):
        if event["type"] == "train.resumed":
            saved = [int(e["data"]["step"]) for e in evs[:i] if e["type"] == "train.checkpoint"]
            assert saved and int(event["data"]["step"]) >= max(saved), (event["data"], saved)
            # ...and trained there (the lost node's trainer died with it and pushed nothing newer)
            later = [int(e["data"]["step"]) for e in evs[i:] if e["type"] == "train.step"]
            assert later and min(later) > int(event["data"]["step"]), (event["data"], later[:3])
    if plan == "train_first_mid_last":
        assert kinds.count("train.resumed") == len(points)


def test_a_spot_pod_told_to_stop_keeps_its_step_and_the_next_node_goes_on_from_it(
    case: Case, tmp_path: Path
) -> None:
    """RunPod's preemption as a container's stop: SIGTERM to the pod's start script, whose trap tells the
    trainer (the node's stop notice); the trainer keeps a checkpoint at the step it reached and pushes it,
    and the next node goes on from that step, though the job schedules no checkpoint before its end."""
    fake = case.stack.enter_context(
        FakeRunPod(api_key=CANARIES["RUNPOD_API_KEY"], home=tmp_path / "fake", nodes="ray")
    )
    # RunPod gives 5 s; here more, so that a loaded machine's slow save does not make the case flaky: what
    # is under test is the way from SIGTERM to the resume (the save's own time is train.stopped's saved_in_s).
    fake.stop_notice_s = 30.0
    fleet = LiveFleet(case, tmp_path / "fleet", [fake], FLEET_PREEMPT_BACKOFF_S="1")
    job = light_job_file(tmp_path / "job", SECTIONS["runpod"], extra=EXTRA)
    job.write_text(job.read_text().replace("save_steps: 40", "save_steps: 1000"))
    fleet.worker()
    run_id = fleet.enqueue(job)
    case.expect(run_id, RunState.SUCCEEDED)

    def reached() -> int:
        return max(
            (int(e["data"]["step"]) for e in fleet.events(run_id) if e["type"] == "train.step"), default=0
        )

    wait_until(lambda: reached() >= 15, 300, "step 15", every=0.2)
    told_at = reached()
    (live,) = [i for i in fake.state()["instances"] if str(i["name"]).startswith(f"tf-{run_id}-")]
    assert fake.preempt(str(live["id"])), live
    case.inject("preemption")
    wait_until(lambda: fleet.kinds(run_id).count("run.preempted") == 1, 120, "the preemption seen")
    case.check()

    evs = fleet.events(run_id)
    kinds = [e["type"] for e in evs]
    assert "train.restarted" not in kinds and kinds.count("run.succeeded") == 1
    (resumed,) = [e["data"] for e in evs if e["type"] == "train.resumed"]
    assert int(resumed["step"]) >= told_at  # the step the stopped trainer reached: no other was saved
    at = kinds.index("train.resumed")
    kept = [int(e["data"]["step"]) for e in evs[:at] if e["type"] == "train.checkpoint"]
    assert kept in ([], [int(resumed["step"])]), kept  # its line may be lost with the node; no other
    later = [int(e["data"]["step"]) for e in evs[kinds.index("train.resumed") :] if e["type"] == "train.step"]
    assert later and min(later) > int(resumed["step"])
