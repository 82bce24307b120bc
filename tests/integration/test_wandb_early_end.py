"""A run that fails before its trainer starts still has its W&B run (workers.wandb_end): the fleet writes
the planned run itself, with the lifecycle so far and the failure, which is what one needs to debug it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.factories import copy_example_data
from tests.fakes.wandb import FakeWandb
from tests.integration.fleetproc import events_of, fleet, fleet_env
from tests.wandb_log import read_finished_run

pytestmark = pytest.mark.integration
KEY = "wandbcanary" + "9f8e7d6c5b4a" * 2 + "012ab"  # 40 characters, as W&B's keys are

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


def test_online_the_fleet_writes_the_run_it_announced_to_wandb(home: Path, tmp_path: Path) -> None:
    """Online: the fleet's own wandb client opens the planned run on the W&B server the fleet is set to
    (WANDB_BASE_URL, with its WANDB_API_KEY), the one whose URL it announced at provision."""
    job = tmp_path / "jobs" / "broken.yml"
    job.parent.mkdir()
    job.write_text(JOB.format(model=job.parent / "no-such-model").replace("wandb_mode: offline\n", ""))
    copy_example_data(job.parent)
    with FakeWandb(api_key=KEY) as wb:
        # The W&B server from the fleet's settings file, not WANDB_BASE_URL: the fleet's wandb client must
        # be given it (an environment variable would reach the client whatever the fleet did).
        settings = home / "settings.yml"
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(f"wandb_base_url: {wb.url}\nwandb_entity: tester\n")
        env = fleet_env(home, WANDB_API_KEY=KEY, FLEET_SETTINGS_FILE=str(settings))
        env.pop("WANDB_BASE_URL", None)
        done = fleet(env, "run", str(job), "--json", timeout=300)
        written, wb_url = wb.state(), wb.url
    view = json.loads(done.stdout)
    assert done.returncode == 1 and view["failure_reason"] == "PREPARE_FAILED", done.stderr[-2000:]
    (planned,) = [e["data"] for e in events_of(home, view["run_id"]) if e["type"] == "wandb.run"]
    assert planned["url"] == f"{wb_url}/tester/early/runs/{planned['run_id']}"
    assert written["refused"] == [], written["refused"]
    (run,) = written["runs"]
    assert (run["entity"], run["project"], run["name"]) == ("tester", "early", planned["run_id"])
    assert run["complete"] and run["exit_code"] == 1
    assert (
        run["summary"]["failure_reason"] == "PREPARE_FAILED" and run["summary"]["ended_in_stage"] == "prepare"
    )
    assert run["config"]["fleet_run_id"]["value"] == view["run_id"]
    assert KEY not in done.stdout + done.stderr
