"""F1's named point: the worker crashes (FLEET_CRASH_AT=after_create_call: `os._exit(137)` in the pool
process) right after the cloud's create call returned and before the ledger heard of the instance. The
run's next provision task (the crashed one's message comes back: reject_on_worker_lost) must find the
instance by its name and adopt it (`instance.adopted`), never create a second one; the test also kills the
crashed worker whole and starts a clean one, as an operator would.

The node never gets ready here (a stub that takes an hour), so the run is cancelled once adopted; the full
cloud runs (test_cloud_runs.py) go through the same crash and train to the end.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from core.crashpoints import CRASH_ENV, CrashPoint
from state.stages import RunState
from tests.factories import RUNPOD_SECTION, light_job_file
from tests.fakes import FakeRunPod
from tests.faults.case import Case
from tests.faults.live import LiveFleet
from tests.integration.fleetproc import fleet_json, wait_until

pytestmark = pytest.mark.faults


def test_a_crash_between_the_create_call_and_the_ledger_is_adopted_by_name(
    case: Case, tmp_path: Path
) -> None:
    fake = case.cloud(FakeRunPod, tmp_path / "fake", nodes="stub", ready_delay_s=3600)
    fleet = LiveFleet(case, tmp_path / "fleet", [fake])
    crashing = fleet.worker(**{CRASH_ENV: CrashPoint.AFTER_CREATE_CALL.value})
    run_id = fleet.enqueue(light_job_file(tmp_path / "job", RUNPOD_SECTION))
    case.expect(run_id, RunState.CANCELLED)

    log = case.logs[-1]
    wait_until(lambda: b"crash point after_create_call" in log.read_bytes(), 120, "the crash", every=0.2)
    crashing.kill_group()  # and the rest of that worker: a clean one takes over
    fleet.worker()
    fleet.wait_event(run_id, "instance.adopted", timeout=120)
    fleet_json(fleet.env, "cancel", run_id, timeout=120)
    case.check()

    kinds = fleet.kinds(run_id)
    assert "instance.requested" not in kinds  # the crash came before the ledger was told
    assert kinds.count("instance.adopted") == 1 and kinds[-1] == "run.cancelled", kinds
    assert fake.state()["requests"]["create"] == 1  # never a second create for the name
