"""The node's axolotl side without axolotl: the config axolotl runs, its environment, the watchdog's verdicts,
the card of an axolotl job, and the readiness check asking for axolotl."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import ModelCard

from tests.factories import REPO_ROOT, TINY_DATA, axolotl_config, train_job
from trainer import progress
from trainer.axolotl_callback import FleetCallback
from trainer.axolotl_run import PLUGIN, RESULT_ENV, child_env, describe_trip, node_config, read_result
from trainer.card import render
from trainer.config import TrainJob, WandbPlan
from trainer.errors import DatasetError
from trainer.nodecheck import check
from trainer.train import fetch

MODEL = Path("/models/tiny")
PLAN = WandbPlan(run_id="tf-r1", project="proj", entity="team", mode="offline", group="sw-1")


def config_for(tmp_path: Path, cuda: bool = True, **overrides: Any) -> dict[str, Any]:
    job = train_job(tmp_path, axolotl_config(**overrides))
    return node_config(job, MODEL, REPO_ROOT, cuda)


def test_the_node_config_points_at_the_nodes_own_paths(tmp_path: Path) -> None:
    job = train_job(
        tmp_path,
        axolotl_config(
            datasets=[
                {"path": "configs/examples/data/tiny-alpaca.jsonl", "type": "alpaca", "ds_type": "json"},
                {"path": "someorg/some-dataset", "type": "alpaca"},
            ],
            axolotl_version="0.19.0",
            hub_model_id="me/adapter",
            hub_strategy="checkpoint",
        ),
    )
    out = node_config(job, MODEL, REPO_ROOT, cuda=True)
    assert out["base_model"] == str(MODEL)  # the model prepare fetched; the job keeps the hub id
    assert out["output_dir"] == job.output_dir
    prepared = Path(job.cache_dir or "") / "axolotl-prepared"  # in the cache, which outlives the run
    assert out["dataset_prepared_path"] == str(prepared)
    assert out["datasets"][0]["path"] == str(REPO_ROOT / "configs/examples/data/tiny-alpaca.jsonl")
    assert out["datasets"][1]["path"] == "someorg/some-dataset"  # a hub dataset: axolotl's to fetch
    assert out["datasets"][0]["type"] == "alpaca" and out["datasets"][0]["ds_type"] == "json"
    assert out["lora_r"] == 4 and out["adapter"] == "lora"  # the job's keys as written
    for key in ("trainer", "axolotl_version", "hub_model_id", "hub_strategy", "hub_private_repo"):
        assert key not in out  # the fleet's own, and the push the fleet makes at finalize
    assert out["auto_resume_from_checkpoints"] is True


def test_a_relative_prepared_path_goes_under_the_cache_and_an_absolute_one_stays(tmp_path: Path) -> None:
    assert config_for(tmp_path, dataset_prepared_path="prep")["dataset_prepared_path"] == str(
        tmp_path / "cache" / "prep"
    )
    assert config_for(tmp_path, dataset_prepared_path="/data/prep")["dataset_prepared_path"] == "/data/prep"
    job = train_job(tmp_path, axolotl_config(), cache_dir=None).model_copy(update={"cache_dir": None})
    assert node_config(job, MODEL, REPO_ROOT, True)["dataset_prepared_path"] == str(
        tmp_path / "work" / "axolotl-prepared"
    )  # a node without a cache: the run's own directory


def test_the_sections_switches_reach_axolotls_config(tmp_path: Path) -> None:
    """deepspeed: true is the fleet's ZeRO-2 file (which exists, and is ZeRO stage 2); log_eval: false
    takes axolotl's own eval table off too; neither is there unless the section asks."""
    plain = config_for(tmp_path, eval_table_size=5)
    assert "deepspeed" not in plain and plain["eval_table_size"] == 5
    job = train_job(tmp_path, axolotl_config(eval_table_size=5), deepspeed=True, log_eval=False)
    out = node_config(job, MODEL, REPO_ROOT, cuda=True)
    assert "eval_table_size" not in out
    zero = json.loads(Path(out["deepspeed"]).read_text(encoding="utf-8"))
    assert zero["zero_optimization"]["stage"] == 2 and zero["train_micro_batch_size_per_gpu"] == "auto"


def test_resume_from_a_named_checkpoint_is_the_jobs(tmp_path: Path) -> None:
    out = config_for(tmp_path, resume_from_checkpoint="outputs/checkpoint-9")
    assert out["resume_from_checkpoint"] == "outputs/checkpoint-9"
    assert "auto_resume_from_checkpoints" not in out


def test_wandb_comes_from_the_fleets_plan_or_not_at_all(tmp_path: Path) -> None:
    config = axolotl_config(
        wandb_project="mine", wandb_name="x", wandb_run_id="y", wandb_mode="online", wandb_watch="gradients"
    )
    planned = node_config(train_job(tmp_path, config, wandb=PLAN), MODEL, REPO_ROOT, True)
    assert {k: v for k, v in planned.items() if k.startswith("wandb_")} == {
        "wandb_project": "proj",
        "wandb_entity": "team",
        "wandb_name": "trainfleet run-test",
        "wandb_run_id": "tf-r1",
        "wandb_mode": "offline",
        "wandb_watch": "gradients",  # the job's own choice, kept
    }
    unplanned = node_config(
        train_job(tmp_path, config.model_copy(update={"use_wandb": True})), MODEL, REPO_ROOT, True
    )
    assert not [k for k in unplanned if k.startswith("wandb_") or k == "use_wandb"]


def test_the_fleets_plugin_is_added_once_after_the_jobs_own(tmp_path: Path) -> None:
    assert config_for(tmp_path)["plugins"] == [PLUGIN]
    theirs = "axolotl.integrations.liger.LigerPlugin"
    assert config_for(tmp_path, plugins=[theirs])["plugins"] == [theirs, PLUGIN]
    assert config_for(tmp_path, plugins=[PLUGIN, theirs])["plugins"] == [PLUGIN, theirs]


def test_without_cuda_the_lora_kernels_are_off_unless_the_job_set_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = config_for(tmp_path, cuda=False, lora_qkv_kernel=True)
    assert (out["lora_mlp_kernel"], out["lora_qkv_kernel"], out["lora_o_kernel"]) == (False, True, False)
    assert "no CUDA" in capsys.readouterr().err
    assert "lora_mlp_kernel" not in config_for(tmp_path, cuda=True)  # axolotl decides, with CUDA


def test_axolotl_runs_with_this_interpreters_tools_no_telemetry_and_the_job(tmp_path: Path) -> None:
    job = train_job(tmp_path, axolotl_config(), wandb=PLAN)
    env = child_env(job, tmp_path / "result.json", {"PATH": "/usr/bin", "AXOLOTL_DO_NOT_TRACK": "0"})
    assert env["PATH"].split(os.pathsep) == [str(Path(sys.executable).parent), "/usr/bin"]
    assert env["AXOLOTL_DO_NOT_TRACK"] == "0"  # the node's own choice stands
    assert env[RESULT_ENV] == str(tmp_path / "result.json")
    assert TrainJob.from_env(env["FLEET_TRAIN_JOB"]) == job
    assert env["WANDB_DIR"] == job.work_dir and env["WANDB_RUN_GROUP"] == "sw-1"
    assert "WANDB_RESUME" not in env  # offline runs cannot be resumed
    online = job.model_copy(update={"wandb": PLAN.model_copy(update={"mode": "online"})})
    assert child_env(online, tmp_path / "r", {})["WANDB_RESUME"] == "allow"
    assert child_env(train_job(tmp_path, axolotl_config()), tmp_path / "r", {})["AXOLOTL_DO_NOT_TRACK"] == "1"


class _State:
    is_world_process_zero = False  # no progress lines: only the verdicts are looked at
    global_step, max_steps, epoch = 0, 10, 0.0


class _Control:
    should_training_stop = False


def logged(callback: FleetCallback, step: int, loss: float) -> bool:
    state, control = _State(), _Control()
    state.global_step = step
    callback.on_log(None, state, control, logs={"loss": loss, "learning_rate": 0.1})
    return control.should_training_stop


def test_the_watchdog_stops_after_patience_high_losses_in_a_row_and_says_why(tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    callback = FleetCallback(
        None, {"loss_watchdog_threshold": 2.0, "loss_watchdog_patience": 2}, None, result
    )
    assert [logged(callback, 1, 3.0), logged(callback, 2, 1.0), logged(callback, 3, 3.0)] == [False] * 3
    assert logged(callback, 4, 5.0)  # two in a row
    trip = read_result(result)["watchdog"]
    assert trip == {"reason": "high_loss", "loss": 5.0, "threshold": 2.0, "patience": 2, "step": 4}
    assert describe_trip(trip) == (
        "loss watchdog: the logged loss was above loss_watchdog_threshold 2.0 for loss_watchdog_patience 2 "
        "logged steps in a row (5 at step 4); training stopped"
    )


def test_a_nan_loss_stops_training_even_without_a_threshold(tmp_path: Path) -> None:
    callback = FleetCallback(None, {}, None, tmp_path / "result.json")
    assert not logged(callback, 1, 1e9)
    assert logged(callback, 2, float("nan"))
    assert "was nan at step 2" in describe_trip(read_result(tmp_path / "result.json")["watchdog"])


def test_the_card_of_an_axolotl_job_shows_its_settings_and_release() -> None:
    config = axolotl_config(warmup_steps=2, axolotl_version="0.18.0")
    metrics = {"eval_loss_first": 7.8, "eval_loss": 7.4, "global_step": 6, "num_workers": 1}
    card = ModelCard(
        render(config, metrics, run_id="r1", target_modules=["q_proj"], trainer_version="0.19.0")
    )
    assert card.data.get("base_model") == "trainfleet/tiny-llama" and card.data.get("library_name") == "peft"
    assert "axolotl" in card.data.get("tags") and "base_model:adapter:trainfleet/tiny-llama" in card.data.get(
        "tags"
    )
    for row in (
        "| trainer | axolotl 0.19.0 |",
        "| adapter | lora r=4, alpha=8.0, dropout=- |",
        "| target modules | q_proj |",
        "| sequence length | 96 |",
        "| micro batch size | 4 |",
        "| max steps | 6 |",
        "| learning rate | 0.002 |",
        "| scheduler | cosine |",
        "| optimizer | adamw_torch |",
        "| warmup | 2 |",
        "| eval loss after training | 7.4000 |",
    ):
        assert row in card.text, row
    assert "trained with trainfleet (axolotl 0.19.0)" in card.text


def test_the_card_of_a_full_fine_tune_describes_a_whole_model() -> None:
    config = axolotl_config(adapter=None)
    card = ModelCard(render(config, {}, run_id="r1", target_modules=[]))
    assert card.data.get("library_name") == "transformers"
    assert "base_model:finetune:trainfleet/tiny-llama" in card.data.get("tags")
    assert "| adapter | none (full fine-tune) |" in card.text and "PeftModel" not in card.text


def test_the_readiness_check_asks_for_axolotl_only_when_told() -> None:
    missing = check(0, None, None, {}, axolotl="0.19.0")  # the fleet's environment has no axolotl
    assert missing["problems"] == ["axolotl is missing (not installed)"]
    assert missing["missing"]["axolotl"] == "not installed"
    assert check(0, None, None, {}, axolotl="any")["problems"] == ["axolotl is missing (not installed)"]
    assert check(0, None, None, {})["problems"] == []


def test_fetch_builds_the_model_and_checks_the_local_data_leaving_hub_datasets_to_axolotl(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    datasets = [
        {"path": "configs/examples/data/tiny-alpaca.jsonl", "type": "alpaca", "ds_type": "json"},
        {"path": "someorg/some-dataset", "type": "alpaca"},
    ]
    job = train_job(tmp_path, axolotl_config(datasets=datasets))
    fetched = fetch(job, REPO_ROOT)
    assert fetched.dataset_files == [str(TINY_DATA)] and fetched.examples == 800
    assert fetched.model_path is not None and (Path(fetched.model_path) / "config.json").is_file()
    (line,) = progress.parse(capsys.readouterr().out)
    assert line["kind"] == "fetched" and line["examples"] == 800
    missing = train_job(tmp_path, axolotl_config(datasets=[{"path": "data/nowhere.jsonl", "type": "alpaca"}]))
    with pytest.raises(DatasetError, match=r"nowhere\.jsonl"):
        fetch(missing, REPO_ROOT)
