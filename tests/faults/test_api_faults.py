"""F3: the clouds' APIs misbehave while a run is provisioned and torn down, on the fake RunPod and vast.ai
(stub nodes: provisioning reaches RUNNING; nothing trains), through the fleet's own stage code and reaper
called in this process (tests.faults.direct).

Each script queues faults on one operation. The providers read instances through the vendor's list call
(RunPod's `myself { pods }`, vast.ai's paged instance list), never its get-one call, so faults go on
search, create, list and terminate. The client's timeout is shortened to 1 s; "hang" carries a request out
and withholds its answer past that timeout (a read timeout after the create applied); "timeout" holds the
request past it and carries it out late; "error_after_create" makes the instance and answers 500;
"terminate_ok_but_listed" destroys it but keeps listing it twice; "not_found" says it is gone while it is
not. Every run must reach RUNNING on one instance, end CANCELLED, and leave nothing behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from state.events import read_run
from state.models import InstanceState
from state.stages import RunState
from tests.factories import RUNPOD_SECTION, VASTAI_SECTION, light_job_file
from tests.fakes import FakeCloud, FakeRunPod, FakeVastAI
from tests.faults.case import Case
from tests.faults.direct import DirectFleet, up
from workers.stages.reap import reap_once

pytestmark = pytest.mark.faults

SECTIONS = {"runpod": RUNPOD_SECTION, "vastai": VASTAI_SECTION}
FAKES: dict[str, type[FakeCloud]] = {"runpod": FakeRunPod, "vastai": FakeVastAI}
CLIENT_TIMEOUT_S = 1.0
PAST_TIMEOUT_S = 1.5  # how long "timeout" and "hang" faults hold a request or its answer

# name -> the fault rules queued before the run is submitted
SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "search": [
        {"op": "search", "kind": "500"},
        {"op": "search", "kind": "429", "retry_after": 1},
        {"op": "search", "kind": "timeout", "delay": PAST_TIMEOUT_S},
    ],
    "create": [
        {"op": "create", "kind": "500"},
        {"op": "create", "kind": "429", "retry_after": 1},
        {"op": "create", "kind": "error_after_create"},
    ],
    "create_hang": [{"op": "create", "kind": "hang", "delay": PAST_TIMEOUT_S}],
    "list": [
        {"op": "list", "kind": "500", "times": 2},
        {"op": "list", "kind": "429", "retry_after": 1},
        {"op": "list", "kind": "timeout", "delay": PAST_TIMEOUT_S},
    ],
    "terminate": [
        {"op": "terminate", "kind": "500"},
        {"op": "terminate", "kind": "429", "retry_after": 1},
        {"op": "terminate", "kind": "hang", "delay": PAST_TIMEOUT_S},
    ],
    "terminate_late": [{"op": "terminate", "kind": "timeout", "delay": PAST_TIMEOUT_S}],
    "terminate_lies": [
        {"op": "terminate", "kind": "not_found"},
        {"op": "terminate", "kind": "terminate_ok_but_listed", "times": 2},
    ],
}
QUICK = {("runpod", "create"), ("vastai", "create_hang"), ("runpod", "terminate_lies")}
CASES = [
    pytest.param(vendor, script, marks=() if (vendor, script) in QUICK else pytest.mark.faults_full)
    for vendor in sorted(FAKES)
    for script in sorted(SCRIPTS)
]


def served_by(rules: list[dict[str, Any]]) -> int:
    """How many faults the rules serve when all are used (a terminate_ok_but_listed is one terminate;
    its `times` counts the listings after it)."""
    return sum(1 if r["kind"] == "terminate_ok_but_listed" else r.get("times", 1) for r in rules)


@pytest.mark.parametrize(("vendor", "script"), CASES)
def test_api_faults_during_provision_and_teardown_in_process(
    case: Case,
    vendor: str,
    script: str,
    redis_client: redis.Redis[str],
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = case.cloud(FAKES[vendor], tmp_path / "fake", nodes="stub")
    fleet = DirectFleet(case, redis_url, tmp_path / "fleet", [fake], monkeypatch)
    fleet.client_timeout(vendor, CLIENT_TIMEOUT_S)
    fake.add_faults(SCRIPTS[script])
    run_id = fleet.submit(light_job_file(tmp_path / "job", SECTIONS[vendor]))
    case.expect(run_id, RunState.CANCELLED)

    provisioned = fleet.drive(run_id, until=up)
    run = fleet.ctx.ledger.get_run(run_id)
    assert run.state == RunState.PREPARING, (run.state, run.failure_message)
    fleet.cancel(run_id)
    torn_down = fleet.drive(run_id, until=lambda r: False)
    case.notes["retries"] = provisioned.retries + torn_down.retries
    case.check()

    # Every fault queued was served (a script that no request reaches proves nothing).
    assert sum(fake.state()["faults_served"].values()) == served_by(SCRIPTS[script]), fake.state()
    assert fake.state()["requests"]["create"] == 1 + sum(
        1 for r in SCRIPTS[script] if r["op"] == "create" and r["kind"] in ("500", "429")
    )  # a create again only after a refusal that made nothing
    # The ledger agrees with the cloud once the reaper has looked: the instance is TERMINATED.
    assert run.instance is not None
    for _ in range(5):
        record = fleet.ctx.ledger.get_instance(run.instance)
        if record is not None and record.state == InstanceState.TERMINATED:
            break
        reap_once(fleet.ctx)
    assert record is not None and record.state == InstanceState.TERMINATED, record


@pytest.mark.faults_full
def test_a_create_carried_out_after_the_timeout_and_the_retry_in_process(
    case: Case,
    redis_client: redis.Redis[str],
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RunPod's create held 3 s, past the client's 1 s timeout and Celery's first retries. The create had no
    clear answer, so provision only looks the name up (FLEET_CREATE_SETTLE_S) until the late create shows,
    and adopts it: one instance, never two live at once."""
    fake = case.cloud(FakeRunPod, tmp_path / "fake", nodes="stub")
    fleet = DirectFleet(case, redis_url, tmp_path / "fleet", [fake], monkeypatch)
    fleet.client_timeout("runpod", CLIENT_TIMEOUT_S)
    fake.add_faults([{"op": "create", "kind": "timeout", "delay": 3.0}])
    run_id = fleet.submit(light_job_file(tmp_path / "job", SECTIONS["runpod"]))
    case.expect(run_id, RunState.CANCELLED)
    fleet.drive(run_id, until=up)
    adopted = fleet.ctx.ledger.get_run(run_id).instance
    assert adopted and [i["name"] for i in fake.state()["instances"]] == [adopted]  # the late create's pod
    fleet.cancel(run_id)
    fleet.drive(run_id, until=lambda r: False)
    case.check()
    assert fake.state()["requests"]["create"] == 1
    kinds = [e.type.value for _, e in read_run(fleet.ctx.redis, run_id)]
    assert "instance.adopted" in kinds and "instance.requested" not in kinds, kinds
