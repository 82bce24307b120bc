"""A run that fails before its trainer starts still has its W&B run (workers.wandb_end): the fleet writes
the planned run itself, with the lifecycle so far and the failure, which is what one needs to debug it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.factories import copy_example_data
from tests.integration.fleetproc import events_of, fleet, fleet_env
from tests.wandb_log import read_finished_run

pytestmark = pytest.mark.integration

JOB = """\
base_model: {model}
adapter: lora
datasets:
  - path: data/tiny-alpaca.jsonl
    type: alpaca
max_steps: 2
wandb_project: early
wandb_mode: offline
local:
  one_shot: true
"""


def test_a_run_that_fails_in_prepare_gets_its_wandb_run_from_the_fleet(home: Path, tmp_path: Path) -> None:
    job = tmp_path / "jobs" / "broken.yml"
    job.parent.mkdir()
    job.write_text(JOB.format(model=job.parent / "no-such-model"))  # inside the job's directory, missing
    copy_example_data(job.parent)
    env = fleet_env(home)
    done = fleet(env, "run", str(job), "--json", timeout=300)
    view = json.loads(done.stdout)
    assert done.returncode == 1 and view["state"] == "FAILED", done.stderr[-2000:]
    assert view["failure_reason"] == "PREPARE_FAILED"
    (planned,) = [e["data"] for e in events_of(home, view["run_id"]) if e["type"] == "wandb.run"]

    run_dir = Path(view["output_dir"]).parent
    (log,) = run_dir.glob(f"wandb/offline-run-*/run-{planned['run_id']}.wandb")
    run = read_finished_run(log)
    assert run.run_id == planned["run_id"] and run.project == "early" and run.exit_code == 1
    assert run.summary["failure_reason"] == "PREPARE_FAILED" and run.summary["ended_in_stage"] == "prepare"
    assert "no-such-model" in run.summary["failure_message"]
    assert run.config["fleet_run_id"] == view["run_id"]
    assert run.summary["lifecycle/instance.requested/price_per_hour"] == 0.0  # the story before the end
