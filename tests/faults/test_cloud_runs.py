"""F1 + F3 on the clouds: full runs on the fake RunPod and vast.ai, whose instances are real local Ray
heads, while their APIs misbehave (many faults queued for one run), trained to the end.

- RunPod: the offer search fails, the create is refused (429 with Retry-After) and then errors after
  making the pod, the list call fails and is rate limited while the node boots, and the terminate fails,
  then "succeeds" while the pod stays listed.
- vast.ai: the worker crashes between the create call and the ledger write (FLEET_CRASH_AT) and a new one
  adopts the instance by its label; the offer search is over quota, the list fails, the first list call
  after training began outlasts the fleet's read timeout, and the terminate answers "not found" while the
  instance lives on, so the reaper has to finish it. It pushes to the Hub.

In both, list calls fail or are rate limited all along the run (SPREAD), so each stage's polls and the
reaper's passes go through some.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from core.crashpoints import CRASH_ENV, CrashPoint
from state.stages import RunState
from tests.factories import RUNPOD_SECTION, VASTAI_SECTION, light_job_file
from tests.fakes import FakeRunPod, FakeVastAI
from tests.faults.case import Case
from tests.faults.live import LiveFleet
from tests.integration.fleetproc import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.faults_full]
# All along the run (node boot, training, finalize, the reaper's passes): every 5th list call fails, or is
# rate limited, up to 20 times each: every stage's polls and the reaper meet them.
SPREAD = [
    {"op": "list", "kind": "500", "times": 20, "every": 5},
    {"op": "list", "kind": "429", "retry_after": 0.5, "times": 20, "every": 4},
]
CLIENT_TIMEOUT_S = 10  # the fleet's read timeout of a provider call here (provider_api_timeout_s: 60 s)
TIMED_OUT = b"vast.ai did not answer in time"  # providers.vastai.provider.translate


def test_a_runpod_run_through_api_faults(case: Case, tmp_path: Path) -> None:
    fake = case.cloud(FakeRunPod, tmp_path / "fake", nodes="ray")
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
    run_id = fleet.enqueue(light_job_file(tmp_path / "job", RUNPOD_SECTION))
    case.expect(run_id, RunState.SUCCEEDED)
    case.check()

    state = fake.state()
    assert sum(state["faults_served"].values()) >= len(rules) + 1, state["faults_served"]  # list 500 x2
    assert state["requests"]["create"] == 2  # again only after the 429, which made nothing
    kinds = fleet.kinds(run_id)
    # One node: recorded when the create's own lookup found the pod, or adopted by name on the next try
    # when that lookup itself met a list fault.
    assert kinds.count("instance.requested") + kinds.count("instance.adopted") == 1, kinds
    assert "train.finished" in kinds and kinds.count("run.succeeded") == 1, kinds


def test_a_vastai_run_through_a_crash_and_api_faults(case: Case, tmp_path: Path) -> None:
    fake = case.cloud(FakeVastAI, tmp_path / "fake", nodes="ray")
    rules = [
        {"op": "search", "kind": "quota", "retry_after": 1},
        {"op": "list", "kind": "500", "times": 2},
        {"op": "terminate", "kind": "not_found"},
        *SPREAD,
    ]
    fake.add_faults(rules)
    fleet = LiveFleet(case, tmp_path / "fleet", [fake])
    timeout = {"FLEET_PROVIDER_API_TIMEOUT_S": str(CLIENT_TIMEOUT_S)}
    crashing = fleet.worker(**{CRASH_ENV: CrashPoint.AFTER_CREATE_CALL.value}, **timeout)
    run_id = fleet.enqueue(
        light_job_file(tmp_path / "job", VASTAI_SECTION, extra="hub_model_id: tester/tiny-vast\n")
    )
    case.expect(run_id, RunState.SUCCEEDED)
    log = case.logs[-1]
    wait_until(lambda: b"crash point after_create_call" in log.read_bytes(), 120, "the crash", every=0.2)
    crashing.kill_group()
    fleet.worker(**timeout)
    # The first list call once it trains outlasts the fleet's read timeout: whoever made it (the reaper's
    # pass, the watcher's look at the node being terminated, a finalize task) gives up after CLIENT_TIMEOUT_S
    # and says so, and takes it as the vendor's outage; the run goes on meanwhile.
    fleet.wait_event(run_id, "train.submitted")
    fake.add_faults([{"op": "list", "kind": "timeout", "delay": CLIENT_TIMEOUT_S + 5}])
    worker_log = case.logs[-1]
    wait_until(lambda: TIMED_OUT in worker_log.read_bytes(), CLIENT_TIMEOUT_S + 60, "the client's timeout")
    case.check()

    state = fake.state()
    assert state["faults_served"]["list:timeout"] == 1, state["faults_served"]
    assert sum(state["faults_served"].values()) >= 5 + 2, state["faults_served"]
    assert state["requests"]["create"] == 1  # the crashed create's instance was adopted, not made again
    kinds = fleet.kinds(run_id)
    assert kinds.count("instance.adopted") == 1 and "instance.requested" not in kinds, kinds
    assert kinds.count("finalize.pushed") == 1 and kinds.count("run.succeeded") == 1, kinds
    (repo,) = fleet.hub.state()["repos"]
    assert len(repo["commits"]) == 2
