"""`fleet flower`: after a run, Flower's HTTP API lists the run's stage tasks by name with its run id, and
no credential of the fleet shows up there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from broker.constants import REAP_TASK, Stage
from tests.factories import light_job_file
from tests.integration.fleetproc import Worker, fleet_env, fleet_json, wait_for_end, wait_until
from tests.integration.flowerproc import api_tasks, flower

pytestmark = pytest.mark.integration
CANARY = "canary-flower-credential-5f1e9a"
STAGE_TASKS = [stage.task_name for stage in Stage]


def test_flower_lists_a_runs_stage_tasks_by_name_with_its_run_id(home: Path, tmp_path: Path) -> None:
    # The credentials a fleet holds, all set (a local run uses none of them). Flower's own periodic
    # "enable events" broadcast is off: the workers must send their task events by themselves.
    secrets = {name: CANARY for name in ("RUNPOD_API_KEY", "VAST_API_KEY", "HF_TOKEN", "WANDB_API_KEY")}
    env = fleet_env(home, **secrets, FLOWER_ENABLE_EVENTS="false")
    log = home / "flower.log"
    with flower(env, log) as url:  # first: Flower knows only the tasks whose events it saw
        worker = Worker(env, home / "worker.log")
        try:
            (queued,) = fleet_json(env, "enqueue", str(light_job_file(tmp_path / "job")))
            run_id = queued["run_id"]
            assert wait_for_end(env, run_id, timeout=240)["state"] == "SUCCEEDED"

            def stages_done() -> dict[str, dict[str, Any]] | None:
                tasks = api_tasks(url)  # events arrive asynchronously: poll briefly
                ours = [t for t in tasks.values() if t["name"] in STAGE_TASKS]
                done = {t["name"] for t in ours if t["state"] == "SUCCESS"}
                return tasks if done == set(STAGE_TASKS) else None

            tasks = wait_until(stages_done, 15, "the run's four stage tasks SUCCESS in Flower")
        finally:
            worker.stop()
    ours = [t for t in tasks.values() if t["name"] in STAGE_TASKS]
    for task in ours:  # each stage task (polls included) carries the run id and nothing else
        assert task["args"] == repr([run_id]) and task["kwargs"] == "{}", task
        assert task["state"] == "SUCCESS" and task["worker"], task
    assert min(ours, key=lambda t: float(t["received"]))["name"] == Stage.PROVISION.task_name
    assert all(t["args"] == "()" for t in tasks.values() if t["name"] == REAP_TASK)  # beat's reaper: none
    assert CANARY not in json.dumps(tasks) and CANARY not in log.read_text()
