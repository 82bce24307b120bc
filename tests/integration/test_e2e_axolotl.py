"""An axolotl job end to end through the real CLI: embedded Redis, real Celery workers, a real local Ray
head running in the axolotl environment (`make axolotl-env`: axolotl 0.19 with its own pins, never the
fleet's venv), axolotl itself training the tiny model on the CPU, and trainfleet's plugin inside it turning
axolotl's steps, evals and checkpoints into the fleet's events."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from core.node_settings import DEFAULT_AXOLOTL_VERSION
from providers.local.client import AXOLOTL_VENV
from tests.factories import REPO_ROOT, copy_example_data
from tests.integration.fleetproc import events_of, fleet, fleet_env, fleet_json, live_heads

pytestmark = pytest.mark.integration
AXOLOTL_PYTHON = REPO_ROOT / AXOLOTL_VENV / "bin" / "python"

# An axolotl config as a user writes it (ds_type is axolotl's: the builtin recipe has no such key, so
# trainfleet picks axolotl without being told), with a local section and W&B offline.
JOB = """\
base_model: trainfleet/tiny-llama
datasets:
  - path: data/tiny-alpaca.jsonl
    ds_type: json
    type: alpaca
adapter: lora
lora_r: 8
lora_alpha: 16
lora_dropout: 0.05
lora_target_linear: true
sequence_len: 96
micro_batch_size: 4
gradient_accumulation_steps: 1
max_steps: 8
learning_rate: 0.01
lr_scheduler: cosine
warmup_steps: 2
optimizer: adamw_torch
val_set_size: 0.1
eval_steps: 4
save_steps: 4
logging_steps: 1
seed: 42
output_dir: ./outputs
wandb_project: tiny-axolotl
wandb_mode: offline
local:
  one_shot: true
"""


@pytest.fixture
def axolotl_job(tmp_path: Path) -> Path:
    assert AXOLOTL_PYTHON.exists(), f"no axolotl environment at {AXOLOTL_PYTHON}: run `make axolotl-env`"
    job = tmp_path / "jobs" / "tiny-axolotl.yml"
    job.parent.mkdir()
    job.write_text(JOB)
    copy_example_data(job.parent)
    return job


def test_an_axolotl_job_runs_end_to_end_with_the_fleets_events(home: Path, axolotl_job: Path) -> None:
    env = fleet_env(home)
    checked = fleet(env, "validate", str(axolotl_job))
    assert checked.returncode == 0 and "trainer: axolotl (chosen: " in checked.stdout, checked.stdout
    assert "datasets[0].ds_type: json" in checked.stdout

    done = fleet(env, "run", str(axolotl_job), "--json", timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    view = json.loads(done.stdout)
    run_id = view["run_id"]
    assert view["state"] == "SUCCEEDED" and view["trainer"] == f"axolotl {DEFAULT_AXOLOTL_VERSION}"

    evs = events_of(home, run_id)
    kinds = [e["type"] for e in evs]
    # The node is the axolotl environment, checked to have axolotl at the run's release before training.
    (ready,) = [e["data"]["check"] for e in evs if e["type"] == "node.ready"]
    assert Path(ready["executable"]).parent == AXOLOTL_PYTHON.parent
    assert ready["versions"]["axolotl"] == DEFAULT_AXOLOTL_VERSION
    # The plugin's lines, from inside axolotl's trainer, as the builtin recipe's: steps, evals, checkpoints.
    (started,) = [e["data"] for e in evs if e["type"] == "train.started"]
    assert started["total_steps"] == 8
    steps = [e["data"] for e in evs if e["type"] == "train.step"]
    assert [s["step"] for s in steps] == list(range(1, 9))
    assert all(math.isfinite(s["loss"]) and s["learning_rate"] >= 0 for s in steps)
    evals = [e["data"]["eval_loss"] for e in evs if e["type"] == "train.eval"]
    assert len(evals) >= 2 and all(math.isfinite(x) for x in evals)
    saved = [e["data"]["step"] for e in evs if e["type"] == "train.checkpoint"]
    assert 4 in saved and 8 in saved
    assert kinds.index("train.step") < kinds.index("train.finished") < kinds.index("run.succeeded")
    assert view["metrics"]["eval_loss"] == pytest.approx(evals[-1], rel=1e-5)  # the event is rounded

    # fleet logs shows them too.
    logs = fleet(env, "logs", run_id)
    assert logs.returncode == 0 and "train.step" in logs.stdout and "train.checkpoint" in logs.stdout

    # The adapter came back with trainfleet's card, naming the hub id of the base model, not a node path.
    out = Path(view["output_dir"])
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == "trainfleet/tiny-llama"
    assert (out / "adapter_model.safetensors").stat().st_size > 0
    card = (out / "README.md").read_text()
    assert "axolotl" in card and "trainfleet" in card
    samples = [json.loads(line) for line in (out / "eval_samples.jsonl").read_text().splitlines()]
    assert samples and {"step", "input", "prediction", "label"} <= set(samples[0])
    # W&B offline: axolotl logged into the run the fleet planned.
    wandb_plan = json.loads(fleet(env, "status", run_id, "--json").stdout)["progress"]["wandb"]
    assert list(Path(view["output_dir"]).parent.rglob(f"offline-run-*-{wandb_plan['run_id']}"))
    assert live_heads(home) == []
    (listed,) = fleet_json(env, "status")
    assert listed["trainer"] == f"axolotl {DEFAULT_AXOLOTL_VERSION}"
