"""`prepare_ds_only: true` end to end through the real CLI: the run tokenizes its datasets into the node's
cache and ends SUCCEEDED without training (no steps, no adapter, no push), and a later training run of the
same job starts from what it kept; for axolotl, its own `preprocess` in the axolotl environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.factories import copy_example_data
from tests.integration.fleetproc import events_of, fleet, fleet_env
from tests.integration.test_e2e_axolotl import AXOLOTL_PYTHON
from tests.integration.test_e2e_axolotl import JOB as AXOLOTL_JOB
from trainer.prepared import REPORT_FILE

pytestmark = pytest.mark.integration

BUILTIN_JOB = """\
base_model: trainfleet/tiny-llama
datasets:
  - path: data/tiny-alpaca.jsonl
    type: alpaca
adapter: lora
lora_r: 4
lora_alpha: 8
sequence_len: 96
micro_batch_size: 4
max_steps: 2
val_set_size: 8
hub_model_id: me/never-pushed
output_dir: ./outputs
local:
  prepare_ds_only: true
"""


def job_file(tmp_path: Path, text: str) -> Path:
    job = tmp_path / "jobs" / "prep.yml"
    job.parent.mkdir(exist_ok=True)
    job.write_text(text)
    if not (job.parent / "data").exists():
        copy_example_data(job.parent)
    return job


def run(env: dict[str, str], job: Path) -> dict[str, object]:
    done = fleet(env, "run", str(job), "--json", timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    view: dict[str, object] = json.loads(done.stdout)
    assert view["state"] == "SUCCEEDED", view
    return view


def test_a_prepare_only_run_keeps_the_tokens_and_the_next_run_trains_from_them(
    home: Path, tmp_path: Path
) -> None:
    env = fleet_env(home)
    job = job_file(tmp_path, BUILTIN_JOB)
    view = run(env, job)
    run_id = str(view["run_id"])
    kinds = [e["type"] for e in events_of(home, run_id)]
    assert "train.finished" in kinds and "run.succeeded" in kinds
    assert not {"train.started", "train.step", "hub.push"} & set(kinds)  # nothing trained, nothing pushed
    counts = {"prepared_examples": 800, "train_examples": 792, "eval_examples": 8, "dropped_examples": 0}
    metrics = view["metrics"]
    assert isinstance(metrics, dict) and {k: metrics[k] for k in counts} == counts
    assert metrics["eval_loss"] is None  # nothing was evaluated
    out = Path(str(view["output_dir"]))
    assert sorted(p.name for p in out.iterdir()) == [REPORT_FILE]
    report = json.loads((out / REPORT_FILE).read_text())
    assert Path(report["cache"]).is_dir() and report["from_cache"] is False

    job.write_text(
        BUILTIN_JOB.replace("  prepare_ds_only: true\n", "  one_shot: true\n").replace(
            "hub_model_id: me/never-pushed\n", ""
        )
    )
    trained = run(env, job)
    assert (Path(str(trained["output_dir"])) / "adapter_model.safetensors").is_file()
    node_log = fleet(env, "logs", str(trained["run_id"]), "--node")
    assert f"tokenized examples from {report['cache']}" in node_log.stdout, node_log.stdout[-3000:]


def test_an_axolotl_prepare_only_run_is_axolotls_preprocess(home: Path, tmp_path: Path) -> None:
    assert AXOLOTL_PYTHON.exists(), f"no axolotl environment at {AXOLOTL_PYTHON}: run `make axolotl-env`"
    env = fleet_env(home)
    job = job_file(tmp_path, AXOLOTL_JOB.replace("  one_shot: true\n", "  prepare_ds_only: true\n"))
    view = run(env, job)
    kinds = [e["type"] for e in events_of(home, str(view["run_id"]))]
    assert "train.step" not in kinds and "train.finished" in kinds
    metrics = view["metrics"]
    assert isinstance(metrics, dict) and metrics["prepared_rows"] > 0
    report = json.loads((Path(str(view["output_dir"])) / REPORT_FILE).read_text())
    assert report["trained"] is False
    assert Path(report["cache"]).name == "axolotl-prepared" and any(Path(report["cache"]).iterdir())
    assert not (Path(str(view["output_dir"])) / "adapter_model.safetensors").exists()
