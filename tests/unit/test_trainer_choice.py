"""jobs.trainer_choice through jobs.spec: which trainer a job gets, and why; a key the chosen trainer would
ignore is an error naming it; real axolotl configs validate unchanged; `fleet validate --plan` shows it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from core.errors import ConfigError, Problem
from fleet.cli import cli
from jobs.shipping import ship_datasets
from jobs.spec import JobSpec, LoadedJob, load_job, parse_job
from trainer.config import AxolotlConfig, TrainConfig

REPO = Path(__file__).resolve().parents[2]
REAL = REPO / "tests" / "data" / "axolotl"
REAL_CONFIGS = sorted(REAL.glob("*.yml"))
# The machine each real config was written for, where it is not one GPU (jobs.topology refuses the rest).
WRITTEN_FOR: dict[str, dict[str, Any]] = {"lora-1b-ray": {"runpod": {"gpu_count": 4}}}  # 4 Ray workers
TINY = "base_model: trainfleet/tiny-llama\ndatasets:\n  - path: tatsu-lab/alpaca\n    type: alpaca\n"
LORA = TINY + "adapter: lora\n"


def parse(text: str, **kwargs: Any) -> LoadedJob:
    return parse_job(text.encode(), source="job.yml", base_dir=REPO, **kwargs)


def problems_of(text: str, **kwargs: Any) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        parse(text, **kwargs)
    return info.value.problems


def test_a_job_the_builtin_recipe_implements_gets_it_and_says_why() -> None:
    job = parse(LORA + "optimizer: adamw_torch\nsample_packing: false\nstrict: false\n")
    assert isinstance(job.spec.train, TrainConfig) and job.choice is not None
    assert (job.choice.trainer, job.choice.explicit, job.choice.forced_by) == ("builtin", False, ())
    assert "implements every training key" in job.choice.describe()
    # `sample_packing: false` asks for nothing; `strict` changes nothing in training: kept, with one warning.
    (warning,) = job.warnings
    assert warning.endswith(": sample_packing, strict")


def test_any_key_the_builtin_recipe_lacks_chooses_axolotl_and_is_named() -> None:
    job = parse(LORA + "optimizer: adafactor\nsample_packing: true\n")
    assert isinstance(job.spec.train, AxolotlConfig) and job.choice is not None
    assert job.choice.forced_by == ("optimizer: adafactor", "sample_packing")
    assert job.choice.describe().startswith("trainer: axolotl (chosen: the builtin recipe does not implement")
    assert job.warnings == []


def test_no_adapter_means_the_whole_model_which_only_axolotl_trains() -> None:
    job = parse(TINY)
    assert job.choice is not None and job.choice.trainer == "axolotl"
    assert job.choice.forced_by == ("training the whole model (no `adapter:`)",)


def test_trainer_builtin_with_keys_it_would_ignore_names_every_one_with_its_line() -> None:
    text = "trainer: builtin\n" + LORA + "optimizer: adafactor\nfsdp: [full_shard]\nsample_packing: true\n"
    problems = problems_of(text)
    assert [(p.path, p.line) for p in problems] == [
        ("optimizer", 7),
        ("fsdp", 8),
        ("sample_packing", 9),
    ]
    assert all("builtin recipe does not implement" in p.message for p in problems)
    assert "optimizer: adafactor" in problems[0].message and "trainer: axolotl" in problems[0].message


def test_trainer_builtin_refuses_a_dataset_format_it_cannot_read() -> None:
    text = "trainer: builtin\nadapter: lora\nbase_model: m/m\ndatasets:\n  - path: org/chat\n"
    text += "    type: pygmalion\n"
    (problem,) = problems_of(text)  # once, not again as a pydantic enum error on the same key
    assert (problem.path, problem.line) == ("datasets[0].type", 6)
    assert "pygmalion" in problem.message


def test_keys_only_the_builtin_recipe_has_are_refused_for_axolotl() -> None:
    (named,) = problems_of("trainer: axolotl\n" + LORA + "loss_watchdog_max_rollbacks: 2\n")
    assert named.path == "loss_watchdog_max_rollbacks" and "only the builtin recipe" in named.message
    (chosen,) = problems_of(LORA + "optimizer: adafactor\nray_max_failures: 1\n")
    assert (
        chosen.path == "ray_max_failures" and "axolotl was chosen for optimizer: adafactor" in chosen.message
    )


def test_an_unknown_trainer_is_refused() -> None:
    (problem,) = problems_of("trainer: deepspeed\n" + LORA)
    assert problem.path == "trainer" and "valid: builtin, axolotl" in problem.message


def test_an_axolotl_job_still_gets_the_shared_keys_checked() -> None:
    problems = problems_of(TINY + "lora_r: 0\nmicro_batch_size: -1\nbf16: auto\n")
    assert {p.path for p in problems} == {"lora_r", "micro_batch_size"}


def test_axolotl_with_ray_on_a_node_without_gpus_is_refused_before_renting() -> None:
    (problem,) = problems_of(TINY + "use_ray: true\nlocal:\n  num_gpus: 0\n")
    assert problem.path == "use_ray" and "one GPU per worker" in problem.message
    assert parse(TINY + "use_ray: true\nlocal:\n  num_gpus: 2\n").spec.train.use_ray


def test_the_spec_keeps_its_trainer_through_the_ledger() -> None:
    spec = parse(TINY + "bf16: auto\naxolotl_version: 0.19.0\n").spec
    again = JobSpec.model_validate(json.loads(spec.model_dump_json()))
    assert isinstance(again.train, AxolotlConfig) and again == spec
    old = json.loads(parse(LORA).spec.model_dump_json())
    del old["train"]["trainer"]  # a run recorded before the choice existed
    assert isinstance(JobSpec.model_validate(old).train, TrainConfig)


@pytest.mark.parametrize("path", REAL_CONFIGS, ids=lambda p: p.stem)
def test_every_real_axolotl_config_validates_unchanged_and_goes_to_axolotl(path: Path) -> None:
    # A rented GPU machine: what these configs are written for.
    job = load_job(path, default_provider="runpod", overrides=WRITTEN_FOR.get(path.stem))
    assert isinstance(job.spec.train, AxolotlConfig) and job.choice is not None
    assert job.choice.forced_by and job.warnings == []
    kept = job.spec.train.model_extra or {}
    assert "optimizer" in kept or "adapter" in kept


def test_the_proof_of_concepts_config_keeps_its_runpod_section() -> None:
    job = load_job(REAL / "minotaur.yml", default_provider="local")
    assert job.spec.provider.value == "runpod" and job.spec.gpu_count == 1
    assert job.choice is not None
    # adapter: qlora, optimizer: paged_lion_8bit and its precision keys are the builtin recipe's too now
    assert job.choice.forced_by[0] == "datasets[0].type: alpaca_w_system.load_open_orca"
    assert not {"adapter: qlora", "optimizer: paged_lion_8bit", "load_in_4bit"} & set(job.choice.forced_by)
    assert job.spec.train.hub_model_id == "minotaur-7b-orca"  # a bare name: the token's own namespace


def test_a_local_deepspeed_config_travels_with_the_job(tmp_path: Path) -> None:
    job = load_job(REAL / "deepspeed-zero2.yml", default_provider="runpod")
    deepspeed = (job.spec.train.model_extra or {})["deepspeed"]
    assert deepspeed == str(REAL / "deepspeed_configs" / "zero2.json")
    shipped = ship_datasets(job.spec.train, job.source, tmp_path, job.paths)
    assert (shipped.model_extra or {})["deepspeed"] == "deepspeed/zero2.json"
    assert (tmp_path / "deepspeed" / "zero2.json").read_bytes() == Path(deepspeed).read_bytes()
    (missing,) = problems_of(TINY + "deepspeed: no/such/zero9.json\n")
    assert missing.path == "deepspeed" and "file not found" in missing.message


def test_fleet_validate_prints_the_choice_and_the_plan(tmp_path: Path) -> None:
    runner = CliRunner()
    files = [str(REAL / "qlora.yml"), str(REPO / "configs" / "examples" / "tiny-lora.yml")]
    # qlora.yml has no section: a rented GPU (on a local node without GPUs its 4-bit keys are refused)
    shown = runner.invoke(cli, ["validate", "--plan", "--provider", "runpod", *files])
    assert shown.exit_code == 0, shown.output
    assert "trainer: axolotl (chosen: the builtin recipe does not implement sample_packing" in shown.output
    assert "trainer: builtin (chosen" in shown.output and "command:  axolotl train job.yml" in shown.output
    four_gpus = tmp_path / "lora-1b-ray.yml"  # 4 Ray workers: a machine with 4 GPUs, as it was written for
    four_gpus.write_text((REAL / "lora-1b-ray.yml").read_text() + "runpod:\n  gpu_count: 4\n")
    shutil.copytree(REAL / "deepspeed_configs", tmp_path / "deepspeed_configs")
    as_json = runner.invoke(cli, ["validate", "--json", str(four_gpus)])
    assert as_json.exit_code == 0, as_json.output
    (plan,) = json.loads(as_json.stdout)
    assert plan["trainer"] == "axolotl" and plan["command"] == "axolotl train job.yml --use-ray"
    assert plan["software"].startswith("axolotlai/axolotl:") and plan["axolotl_version"]
    assert plan["workers"] == "4 Ray Train workers, {'GPU': 1} each"
    assert plan["price_per_hour"] is None and "RUNPOD_API_KEY" in plan["price_note"]
