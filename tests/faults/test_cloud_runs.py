"""F1 + F3 on the clouds: full runs on the fake RunPod and vast.ai, whose instances are real local Ray
heads, while their APIs misbehave (many faults queued for one run), trained to the end.

- RunPod: the offer search fails, the create is refused (429 with Retry-After) and then errors after
  making the pod, the list call fails and is rate limited while the node boots, and the terminate fails,
  then "succeeds" while the pod stays listed.
- vast.ai: the worker crashes between the create call and the ledger write (FLEET_CRASH_AT) and a new one
  adopts the instance by its label; the offer search is over quota, the list fails, and the terminate
  answers "not found" while the instance lives on, so the reaper has to finish it. It pushes to the Hub.

In both, list calls fail or are rate limited all along the run (SPREAD), so each stage's polls and the
reaper's passes go through some.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.models import RunState
from fleet.crashpoints import CRASH_ENV, CrashPoint
from tests.factories import light_job_file
from tests.fakes import FakeRunPod, FakeVastAI
from tests.faults.canaries import CANARIES
from tests.faults.case import Case
from tests.faults.live import LiveFleet
from tests.integration.fleetproc import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.faults_full]
RUNPOD = "runpod:\n  gpu: NVIDIA RTX A5000\n  gpu_count: 1\n  max_bid_per_gpu: 0.5\n  one_shot: true\n"
# All along the run (node boot, training, finalize, the reaper's passes): every 5th list call fails, or is
# rate limited, up to 20 times each: every stage's polls and the reaper meet them.
SPREAD = [
    {"op": "list", "kind": "500", "times": 20, "every": 5},
    {"op": "list", "kind": "429", "retry_after": 0.5, "times": 20, "every": 4},
]
VASTAI = (
    "vastai:\n  gpu: RTX_A5000\n  gpu_count: 1\n  max_bid_per_gpu: 0.5\n  cloud_type: ALL\n"
    "  min_vcpu_count: 8\n  min_memory_in_gb: 29\n  one_shot: true\n"
)


def test_a_runpod_run_through_api_faults(case: Case, tmp_path: Path) -> None:
    fake = case.stack.enter_context(
        FakeRunPod(api_key=CANARIES["RUNPOD_API_KEY"], home=tmp_path / "fake", nodes="ray")
    )
    rules = [
        {"op": "search", "kind": "500"},
        {"op": "create", "kind": "429", "retry_after": 1},
        {"op": "create", "kind": "error_after_create"},
        {"op": "list", "kind": "500", "times": 2},
        {"op": "list", "kind": "429", "retry_after": 1},
        {"op": "terminate", "kind": "500"},
        {"op": "terminate", "kind": "terminate_ok_but_listed", "times": 2},
        *SPREAD,
    ]
    fake.add_faults(rules)
    fleet = LiveFleet(case, tmp_path / "fleet", [fake])
    fleet.worker()
    run_id = fleet.enqueue(light_job_file(tmp_path / "job", RUNPOD))
    case.expect(run_id, RunState.SUCCEEDED)
    case.check()

    state = fake.state()
    assert sum(state["faults_served"].values()) >= len(rules) + 1, state["faults_served"]  # list 500 x2
    assert state["requests"]["create"] == 2  # again only after the 429, which made nothing
    kinds = fleet.kinds(run_id)
    assert kinds.count("instance.requested") == 1 and "instance.adopted" not in kinds, kinds
    assert "train.finished" in kinds and kinds.count("run.succeeded") == 1, kinds


def test_a_vastai_run_through_a_crash_and_api_faults(case: Case, tmp_path: Path) -> None:
    fake = case.stack.enter_context(
        FakeVastAI(api_key=CANARIES["VAST_API_KEY"], home=tmp_path / "fake", nodes="ray")
    )
    rules = [
        {"op": "search", "kind": "quota", "retry_after": 1},
        {"op": "list", "kind": "500", "times": 2},
        {"op": "terminate", "kind": "not_found"},
        *SPREAD,
    ]
    fake.add_faults(rules)
    fleet = LiveFleet(case, tmp_path / "fleet", [fake])
    crashing = fleet.worker(**{CRASH_ENV: CrashPoint.AFTER_CREATE_CALL.value})
    run_id = fleet.enqueue(light_job_file(tmp_path / "job", VASTAI, extra="hub_model_id: tester/tiny-vast\n"))
    case.expect(run_id, RunState.SUCCEEDED)
    log = case.logs[-1]
    wait_until(lambda: b"crash point after_create_call" in log.read_bytes(), 120, "the crash", every=0.2)
    crashing.kill_group()
    fleet.worker()
    case.check()

    state = fake.state()
    assert sum(state["faults_served"].values()) >= 4 + 2, state["faults_served"]
    assert state["requests"]["create"] == 1  # the crashed create's instance was adopted, not made again
    kinds = fleet.kinds(run_id)
    assert kinds.count("instance.adopted") == 1 and "instance.requested" not in kinds, kinds
    assert kinds.count("finalize.pushed") == 1 and kinds.count("run.succeeded") == 1, kinds
    (repo,) = fleet.hub.state()["repos"]
    assert len(repo["commits"]) == 2
