"""jobs.spec: a job file becomes a JobSpec, or a ConfigError that lists every problem with key and line."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from core.errors import ConfigError, Problem
from jobs.sections import provider_names, section_models
from jobs.sections.base import SectionBase
from jobs.sections.local import LocalSection
from jobs.spec import (
    JobSpec,
    LoadedJob,
    ProviderName,
    format_problems,
    load_job,
    parse_job,
)
from jobs.yamlsafe import MAX_BYTES
from providers.runpod.section import RunPodSection
from providers.vastai.section import VastAISection
from trainer.config import AxolotlConfig

REPO = Path(__file__).resolve().parents[2]
BAD = REPO / "tests" / "data" / "bad"
EXAMPLE = REPO / "configs" / "examples" / "tiny-lora.yml"
HEAD = "base_model: trainfleet/tiny-llama\ndatasets:\n  - path: tatsu-lab/alpaca\n"
EXPECT = re.compile(rb"^# expect: (?P<path>\S+) line (?P<line>\d+|none): (?P<text>.+)$")


def parse(text: str, base_dir: Path = REPO, **kwargs: Any) -> LoadedJob:
    return parse_job(text.encode(), source="job.yml", base_dir=base_dir, **kwargs)


def problems_of(text: str, base_dir: Path = REPO, **kwargs: Any) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        parse(text, base_dir, **kwargs)
    return info.value.problems


# --- good files -------------------------------------------------------------------------------------------


def test_the_tiny_example_loads_without_problems_or_warnings() -> None:
    job = load_job(EXAMPLE)
    assert job.warnings == []
    assert job.source == str(EXAMPLE)
    assert job.text == EXAMPLE.read_text(encoding="utf-8")
    assert job.spec.provider == ProviderName.LOCAL
    assert isinstance(job.spec.section, LocalSection)
    dataset = Path(job.spec.train.datasets[0].path)
    assert dataset.is_absolute()
    assert dataset.is_file()
    assert dataset == (EXAMPLE.parent / "data" / "tiny-alpaca.jsonl").resolve()


AXOLOTL = """\
base_model: NousResearch/Llama-2-7b-hf
model_type: LlamaForCausalLM
tokenizer_type: LlamaTokenizer
load_in_8bit: true
datasets:
  - path: mhenrichsen/alpaca_2k_test
    type: alpaca
    ds_type: json
dataset_prepared_path: last_run_prepared
val_set_size: 0.05
adapter: lora
lora_r: 32
lora_alpha: 16
lora_dropout: 0.05
lora_target_linear: true
sequence_len: 4096
sample_packing: true
flash_attention: true
bf16: auto
micro_batch_size: 2
gradient_accumulation_steps: 4
num_epochs: 4
optimizer: adamw_torch
lr_scheduler: cosine
learning_rate: 0.0002
special_tokens:
  bos_token: "<s>"
  eos_token: "</s>"
"""


def test_a_real_axolotl_config_goes_to_axolotl_with_every_key_kept_as_written() -> None:
    job = parse(AXOLOTL + "local:\n  num_gpus: 1\n")  # load_in_8bit and flash_attention need a GPU
    train = job.spec.train
    assert job.spec.provider == ProviderName.LOCAL
    assert isinstance(train, AxolotlConfig) and job.choice is not None and not job.choice.explicit
    assert train.datasets[0].path == "mhenrichsen/alpaca_2k_test"
    assert job.warnings == []  # nothing is ignored: axolotl reads every key
    assert set(job.choice.forced_by) == {
        "sample_packing",
        "datasets[0].ds_type: json",
    }
    extra = train.model_extra or {}
    assert train.lora_r == 32 and extra["bf16"] == "auto" and extra["load_in_8bit"] is True  # type: ignore[attr-defined]
    assert extra["special_tokens"] == {"bos_token": "<s>", "eos_token": "</s>"}
    assert extra["model_type"] == "LlamaForCausalLM" and extra["dataset_prepared_path"] == "last_run_prepared"


def test_no_section_means_the_default_provider() -> None:
    assert parse(HEAD).spec.provider == ProviderName.LOCAL
    job = parse(HEAD, default_provider="runpod")
    assert job.spec.provider == ProviderName("runpod")
    assert job.spec.section == RunPodSection()


def test_an_unknown_default_provider_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown default provider 'aws'; valid: local, runpod, vastai"):
        parse(HEAD, default_provider="aws")


@pytest.mark.parametrize("name", [n for n in provider_names() if n != "ssh"])
def test_an_empty_section_selects_the_provider_with_its_defaults(name: ProviderName) -> None:
    job = parse(HEAD + f"{name.value}:\n")
    assert job.spec.provider == name
    assert job.spec.section == section_models()[name]()


def test_an_ssh_section_names_its_pool() -> None:
    with pytest.raises(ConfigError, match=r"ssh.pool \(line \d+\): required key is missing"):
        parse(HEAD + "ssh:\n")
    ssh = section_models()[ProviderName("ssh")]
    assert parse(HEAD + "ssh: {pool: lab}\n").spec.section == ssh.model_validate({"pool": "lab"})


def test_runpod_defaults_are_the_proof_of_concepts() -> None:
    section = parse(HEAD + "runpod: {}\n").spec.section
    assert isinstance(section, RunPodSection)
    assert section.model_dump() == {
        "num_nodes": 1,  # trainfleet's: one machine, as the proof of concept always had
        "one_shot": True,
        "terminate_after": 86400,
        "env": {},
        "pod_type": "ON_DEMAND",  # the proof of concept's example left INTERRUPTABLE commented out
        "max_preemptions": 2,  # trainfleet's: spot machines replaced on spot (auto: then on demand)
        "cloud_type": "SECURE",
        "max_bid_per_gpu": 2.0,
        "gpu_count": 1,
        "container_disk_in_gb": 50,
        "min_vcpu_count": 8,
        "min_memory_in_gb": 29,
        "min_download": None,
        "min_upload": None,
        "stop_after": 900,
        "image": None,  # the fleet's node_image (rayproject/ray:2.60.0-py311-gpu unless set)
        "private_image": False,  # trainfleet's: pulled with the fleet's registry login when true
        "entry": None,
        "debug": False,
        "jupyter": False,
        "log_eval": None,  # the proof of concept's false was "no table"; unset now: as the config says
        "deepspeed": False,
        "gpu": "NVIDIA RTX A5000",
        "template_id": None,
        "volume_in_gb": 200,
        "volume_mount_path": "/content",
        "network_volume_id": None,  # trainfleet's: a network volume instead of the pod's own
        "network_volume": None,  # trainfleet's: a network volume the fleet makes (or finds again)
        "data_center": (),  # trainfleet's (RunPod's dataCenterId): wherever RunPod puts the pod
        "avoid": (),  # trainfleet's: no data center left out
        "axolotl_git": None,
        "axolotl_git_branch": None,
        "axolotl_root": None,
        "prepare_ds_only": False,
        "head": None,  # trainfleet's: the head's own shape in a cluster
    }


def test_a_runpod_cluster_with_a_network_volume_is_valid() -> None:
    text = HEAD + "use_ray: true\nrunpod:\n  num_nodes: 2\n  network_volume_id: vol-abc123\n"
    section = parse(text).spec.section  # (with Ray: without it only the first node would train)
    assert isinstance(section, RunPodSection)
    assert section.num_nodes == 2 and section.network_volume_id == "vol-abc123"
    assert section.MULTI_NODE.supported and section.cluster_problems() == []


def test_every_poc_runpod_key_is_accepted() -> None:
    section = parse(
        HEAD
        + """val_set_size: 0.1
runpod:
  entry: "--foo bar"
  gpu: NVIDIA RTX A6000
  pod_type: ON_DEMAND
  cloud_type: COMMUNITY
  max_bid_per_gpu: 1
  template_id: 758uq6u5fc
  gpu_count: 2
  container_disk_in_gb: 60
  volume_in_gb: 0
  volume_mount_path: /workspace
  min_vcpu_count: 4
  min_memory_in_gb: 16
  min_download: 500
  min_upload: 100
  stop_after: -1
  terminate_after: 3600
  debug: true
  one_shot: false
  log_eval: true
  env: {WANDB_PROJECT: tf}
  prepare_ds_only: true
"""
    ).spec.section
    assert isinstance(section, RunPodSection)
    assert (section.gpu_count, section.max_bid_per_gpu, section.stop_after) == (2, 1.0, -1)
    assert (section.debug, section.log_eval, section.prepare_ds_only) == (True, True, True)


def test_the_poc_s_axolotl_fork_is_installed_and_its_checkout_place_refused() -> None:
    """axolotl_git (and its branch) name a fork the pods install with pip; where it is checked out
    (axolotl_root) is not the job's to say yet, so it is refused rather than ignored."""
    fork = "runpod:\n  gpu_count: 1\n  axolotl_git: https://github.com/utensil/axolotl\n"
    section = parse(
        HEAD + fork + "  axolotl_git_branch: large_dataset\n"
    ).spec.section  # (axolotl: no adapter)
    assert section.axolotl_fork() == ("git+https://github.com/utensil/axolotl", "large_dataset")
    assert parse(HEAD + fork).spec.section.axolotl_fork() == ("git+https://github.com/utensil/axolotl", None)
    (problem,) = problems_of(HEAD + "runpod:\n  gpu_count: 1\n  axolotl_root: /content/axolotl\n")
    assert (problem.path, problem.line) == ("runpod.axolotl_root", 6)
    assert problem.message.startswith("is not supported yet: the node installs axolotl")
    (problem,) = problems_of(HEAD + "runpod:\n  axolotl_git_branch: large_dataset\n")
    assert problem.message == "axolotl_git_branch names a branch of axolotl_git, which is not set"
    ssh = "runpod:\n  axolotl_git: git@github.com:me/axolotl.git\n"
    assert parse(HEAD + ssh).spec.section.axolotl_fork() == ("git+ssh://git@github.com/me/axolotl.git", None)


def test_a_multi_line_entry_is_a_shell_script() -> None:
    script = 'set -e\nif [ -n "$TEST_ENV" ]; then\n  echo "ready: $TEST_ENV"\nfi\n'
    section = parse(
        HEAD + "runpod:\n  entry: |\n" + "".join(f"    {ln}\n" for ln in script.splitlines())
    ).spec
    assert isinstance(section.section, RunPodSection) and section.section.entry == script


def test_an_entry_the_shell_cannot_parse_is_refused_with_its_line() -> None:
    text = (
        HEAD
        + "runpod:\n  gpu_count: 1\n  entry: |\n    echo start\n    if true; then\n      echo never closed\n"
    )
    (problem,) = problems_of(text)
    assert (problem.path, problem.line) == ("runpod.entry", 6)
    assert problem.message == (
        "is not a valid POSIX shell script: line 4 of the script: "
        'Syntax error: end of file unexpected (expecting "fi")'
    )
    assert "never closed" not in problem.message  # the script itself is not echoed


def test_a_stored_spec_is_not_checked_by_the_shell_again() -> None:
    """Only a job file's validation runs `sh -n`; a run's spec read back from the ledger starts no process."""
    assert RunPodSection.model_validate({"entry": "fi"}).entry == "fi"


def test_an_entry_over_16_kib_is_refused() -> None:
    line = "echo " + "x" * 95 + "\n"
    script = line * (16 * 1024 // len(line) + 1)
    (problem,) = problems_of(HEAD + "vastai:\n  entry: " + json.dumps(script) + "\n")
    assert (problem.path, problem.message) == ("vastai.entry", "must be at most 16384 bytes (16 KiB)")
    assert parse(HEAD + "vastai:\n  entry: " + json.dumps(script[: 16 * 1024]) + "\n").spec.section


def test_the_proof_of_concepts_runpod_section_is_read_word_for_word() -> None:
    """Every key of the proof of concept's section is read: those the fleet cannot honour for this job
    (a fork of axolotl; DeepSpeed for the builtin recipe on one GPU) are refused at their lines."""
    path = REPO / "tests" / "data" / "poc_runpod.yml"
    with pytest.raises(ConfigError) as info:
        load_job(path)
    assert [(p.path, p.line) for p in info.value.problems] == [
        ("runpod.axolotl_git", 8),  # a fork of axolotl, for the builtin recipe
        ("runpod.deepspeed", 33),  # DeepSpeed, for the builtin recipe on one GPU
    ]
    assert info.value.problems[0].message.startswith("installs a fork of axolotl, which the builtin recipe")
    text = path.read_text(encoding="utf-8")
    text = text.replace("  axolotl_git: https://github.com/utensil/axolotl\n", "")
    text = text.replace("  axolotl_git_branch: large_dataset\n", "")
    (problem,) = problems_of(text)
    assert (problem.path, problem.line) == ("runpod.deepspeed", 31)
    assert problem.message.startswith("the builtin recipe does not train with DeepSpeed")
    job = parse(text.replace("  deepspeed: true\n", ""))
    section = job.spec.section
    assert isinstance(section, RunPodSection) and job.warnings == []
    assert section.entry == (
        "bash -c \"curl -H 'Cache-Control: no-cache' https://raw.githubusercontent.com/utensil/llm-playground/"
        'main/scripts/entry/ax_lite_train.sh -sSf | bash"\n'
    )
    assert (section.gpu, section.cloud_type, section.max_bid_per_gpu) == (
        "NVIDIA A100 80GB PCIe",
        "SECURE",
        2.0,
    )
    assert (section.stop_after, section.terminate_after, section.prepare_ds_only) == (3600, -1, True)
    assert (section.log_eval, section.env) == (True, {"TEST_ENV": "happy"})


def test_vastai_section_has_its_own_keys() -> None:
    section = parse(HEAD + "vastai:\n  gpu: RTX A6000\n  min_reliability: 0.9\n  gpu_count: 4\n").spec.section
    assert isinstance(section, VastAISection)
    assert (section.gpu, section.min_reliability, section.gpu_count) == ("RTX A6000", 0.9, 4)
    assert "template_id" not in VastAISection.model_fields
    assert "volume_in_gb" not in VastAISection.model_fields


@pytest.mark.parametrize("model", [LocalSection, RunPodSection, VastAISection])
def test_every_section_field_is_described_and_sections_share_one_base(model: type[BaseModel]) -> None:
    assert issubclass(model, SectionBase)
    assert {"one_shot", "env", "terminate_after"} <= set(model.model_fields)
    undescribed = [name for name, field in model.model_fields.items() if not field.description]
    assert undescribed == []


@pytest.mark.parametrize(
    ("section", "path", "message"),
    [
        ("runpod: {gpu_count: '2'}", "runpod.gpu_count", 'must be a whole number (got "2")'),
        ("runpod: {gpu_count: 2.0}", "runpod.gpu_count", "must be a whole number (got 2.0)"),
        ("vastai: {max_bid_per_gpu: .nan}", "vastai.max_bid_per_gpu", "must be a finite number"),
        ("vastai: {min_reliability: 1.5}", "vastai.min_reliability", "must be between 0.0 and 1.0 (got 1.5)"),
        ('runpod: {entry: "echo (a"}', "runpod.entry", "is not a valid POSIX shell script: line 1"),
        ('vastai: {entry: "fi"}', "vastai.entry", 'line 1 of the script: Syntax error: "fi" unexpected'),
        ('runpod: {entry: "a\\0b"}', "runpod.entry", "must not contain NUL characters"),
        ("runpod: {entry: 'echo hf_" + "a1B2" * 9 + "'}", "runpod.entry", "looks like an access token"),
        ("runpod: {image: 'ray image'}", "runpod.image", "must be a name without spaces"),
        ("runpod: {axolotl_git: 'file:///etc'}", "runpod.axolotl_git", "must be an https:// or git@ URL"),
        ("runpod: {stop_after: 0}", "runpod.stop_after", "must be -1 (disabled) or between 60 and 2592000"),
        ("local: {terminate_after: 2592001}", "local.terminate_after", "must be -1 (disabled)"),
        ("local: {num_cpus: 0}", "local.num_cpus", "must be between 1 and 1024 (got 0)"),
        ("runpod: {volume_mount_path: content}", "runpod.volume_mount_path", "must be an absolute path"),
        ('local: {env: {A: "x\\0y"}}', "local.env.A", "must not contain NUL characters"),
        ("local: {one_shot: 'yes'}", "local.one_shot", 'must be true or false (got "yes")'),
        (
            "vastai: {cloud_type: secure}",
            "vastai.cloud_type",
            "must be one of 'ALL', 'COMMUNITY' or 'SECURE'",
        ),
    ],
)
def test_bad_section_values(section: str, path: str, message: str) -> None:
    (problem,) = problems_of(HEAD + section + "\n")
    assert (problem.path, problem.line) == (path, 4)
    assert message in problem.message


def test_env_values_become_text() -> None:
    section = parse(HEAD + "local:\n  env:\n    A: 1\n    B: true\n    C: 0.5\n    D: text\n").spec.section
    assert section.env == {"A": "1", "B": "true", "C": "0.5", "D": "text"}


@pytest.mark.parametrize(
    "name", ["HF_TOKEN", "WANDB_API_KEY", "MY_SECRET", "DB_PASSWORD", "PASSWD", "SSH_KEY"]
)
def test_env_names_that_look_secret_are_refused(name: str) -> None:
    (problem,) = problems_of(HEAD + f"runpod:\n  env:\n    {name}: value\n")
    assert (problem.path, problem.line) == (f"runpod.env.{name}", 6)
    assert "secrets do not belong in the job file" in problem.message


@pytest.mark.parametrize("name", ["MONKEY", "KEYBOARD", "WANDB_PROJECT", "_X", "A1"])
def test_ordinary_env_names_are_accepted(name: str) -> None:
    assert parse(HEAD + f"local:\n  env:\n    {name}: v\n").spec.section.env == {name: "v"}


def test_an_env_value_that_is_a_token_is_refused_without_echoing_it() -> None:
    token = "hf_" + "a1B2" * 9
    (problem,) = problems_of(HEAD + f"vastai:\n  env:\n    HUB: {token}\n")
    assert (problem.path, problem.line) == ("vastai.env.HUB", 6)
    assert token not in problem.message


@pytest.mark.parametrize("value", ["null", "[1, 2]", "{a: 1}"])
def test_env_values_must_be_scalars_and_are_never_echoed(value: str) -> None:
    (problem,) = problems_of(HEAD + f"local:\n  env:\n    A: {value}\n")
    assert problem.message == "must be a string"


def test_every_problem_is_collected_in_line_order() -> None:
    problems = problems_of(
        "datasets:\n  - path: data/missing.jsonl\nlora_r: eight\nrunpod:\n  gpu_count: 0\n  colour: red\n"
    )
    assert [(p.path, p.line) for p in problems] == [
        ("datasets[0].path", 2),
        ("lora_r", 3),
        ("runpod.gpu_count", 5),
        ("runpod.colour", 6),
        ("base_model", None),
    ]


def test_union_errors_become_one_problem() -> None:
    (problem,) = problems_of(HEAD + "    data_files: 5\n")
    assert problem.path == "datasets[0].data_files"
    assert problem.message == "must be a string or a list (got 5)"


def test_a_wrong_type_names_the_key() -> None:
    (problem,) = problems_of(HEAD + "runpod:\n  gpu: 3090\n")
    assert (problem.path, problem.line, problem.message) == ("runpod.gpu", 5, "must be a string (got 3090)")


def test_a_missing_key_points_at_the_line_of_its_mapping() -> None:
    (problem,) = problems_of("base_model: m\ndatasets:\n  - type: alpaca\n    split: train\n")
    assert (problem.path, problem.line, problem.message) == ("datasets[0].path", 3, "required key is missing")


def test_a_section_that_is_not_a_mapping() -> None:
    (problem,) = problems_of(HEAD + "runpod: [1]\n")
    assert (problem.path, problem.line) == ("runpod", 4)


def test_format_problems_gives_one_readable_line_each() -> None:
    with pytest.raises(ConfigError) as info:
        parse_job((HEAD + "runpod:\n  gpu_count: 0\n").encode(), source="configs/x.yml", base_dir=REPO)
    assert (
        format_problems(info.value) == "configs/x.yml:5: runpod.gpu_count: must be between 1 and 16 (got 0)"
    )
    no_line = ConfigError("x.yml", [Problem("base_model", "required key is missing"), Problem("", "bad", 3)])
    assert format_problems(no_line) == "x.yml: base_model: required key is missing\nx.yml:3: bad"


# --- datasets ---------------------------------------------------------------------------------------------


def dataset_path(path: str, base_dir: Path) -> str:
    text = f"base_model: m\ndatasets:\n  - path: {path}\n"
    return parse(text, base_dir).spec.train.datasets[0].path


def test_dataset_paths(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text("{}\n")
    assert dataset_path("data/a.jsonl", tmp_path) == str(tmp_path / "data" / "a.jsonl")
    assert dataset_path("./data", tmp_path) == str(tmp_path / "data")
    assert dataset_path(str(tmp_path / "data" / "a.jsonl"), tmp_path) == str(tmp_path / "data" / "a.jsonl")
    assert dataset_path("tatsu-lab/alpaca", tmp_path) == "tatsu-lab/alpaca"
    assert dataset_path("roneneldan/TinyStories-v1.5", tmp_path) == "roneneldan/TinyStories-v1.5"


@pytest.mark.parametrize(
    "path",
    ["data/missing.jsonl", "missing.jsonl", "org/name.jsonl", "alpaca", "a/b/c"],
)
def test_a_dataset_that_is_neither_a_file_nor_a_hub_id(tmp_path: Path, path: str) -> None:
    (problem,) = problems_of(f"base_model: m\ndatasets:\n  - type: alpaca\n    path: {path}\n", tmp_path)
    assert (problem.path, problem.line) == ("datasets[0].path", 4)
    assert problem.message.startswith(f"file not found: {path} (relative paths are looked up in {tmp_path})")


@pytest.mark.parametrize(("path", "shown"), [('"a\\0b"', "a\0b"), ("x" * 5000, "x" * 77 + "...")])
def test_a_dataset_path_the_system_cannot_even_look_up(path: str, shown: str) -> None:
    (problem,) = problems_of(f"base_model: m\ndatasets:\n  - path: {path}\n")
    assert problem.message.startswith(f"file not found: {shown} (")


# --- overrides, round trip, load_job ----------------------------------------------------------------------


def test_overrides_replace_top_level_keys_and_lose_the_files_line() -> None:
    lora = HEAD + "adapter: lora\nuse_ray: false\n"  # the builtin recipe: axolotl's Ray launcher needs GPUs
    assert parse(lora, overrides={"use_ray": True}).spec.train.use_ray is True
    (problem,) = problems_of(HEAD + "use_ray: false\n", overrides={"use_ray": "maybe"})
    assert (problem.path, problem.line) == ("use_ray", None)


@pytest.mark.parametrize(
    "section", ["local: {num_gpus: 2}", "runpod: {gpu_count: 3}", "vastai: {gpu_count: 4}"]
)
def test_the_spec_survives_a_json_round_trip(section: str) -> None:
    spec = parse(AXOLOTL + "output_dir: out\n" + section + "\n").spec
    assert JobSpec.model_validate(spec.model_dump(mode="json")) == spec
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec
    assert spec.gpu_count == int(section[-2])
    assert spec.one_shot is True


def test_a_dumped_section_is_read_as_its_providers_model() -> None:
    train = parse(HEAD).spec.train.model_dump(mode="json")
    spec = JobSpec.model_validate({"train": train, "provider": "vastai", "section": {"gpu_count": 2}})
    assert spec.section == VastAISection(gpu_count=2)


def test_a_spec_refuses_a_section_of_another_provider() -> None:
    train = parse(HEAD).spec.train
    with pytest.raises(ValidationError, match="needs a RunPodSection"):
        JobSpec(train=train, provider=ProviderName("runpod"), section=LocalSection())


def test_load_job_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_job(tmp_path / "nope.yml")
    with pytest.raises(ConfigError, match="a directory, not a regular file"):
        load_job(tmp_path)
    big = tmp_path / "big.yml"
    big.write_bytes(b"a: 1\n" * (MAX_BYTES // 5 * 2))
    with pytest.raises(
        ConfigError, match=f"file is {big.stat().st_size} bytes; the limit is {MAX_BYTES} bytes"
    ):
        load_job(big)


# --- the bad-input corpus ---------------------------------------------------------------------------------


def corpus() -> list[Path]:
    return sorted(BAD.glob("*.yml"))


def test_the_corpus_is_there() -> None:
    assert len(corpus()) >= 25


@pytest.mark.parametrize("path", corpus(), ids=lambda p: p.stem)
def test_each_bad_file_is_refused_naming_its_key_and_line(path: Path) -> None:
    match = EXPECT.match(path.read_bytes().splitlines()[0])
    assert match, f"{path.name}: first line must be '# expect: <key or -> line <n or none>: <text>'"
    key = match["path"].decode()
    line = None if match["line"] == b"none" else int(match["line"])
    text = match["text"].decode()
    started = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        load_job(path)
    assert time.perf_counter() - started < 1.0
    expected = Problem("" if key == "-" else key, "", line)
    found = [p for p in info.value.problems if (p.path, p.line) == (expected.path, expected.line)]
    assert found, f"no problem at {key} line {line}: {info.value.problems}"
    assert any(text in p.message for p in found), found
    where = f"{path}:{line}: " if line is not None else f"{path}: "
    assert where + (f"{key}: " if key != "-" else "") in format_problems(info.value)


# --- nothing but ConfigError --------------------------------------------------------------------------------

YAMLISH = st.text(alphabet=st.sampled_from(list("ab:- \n\t[]{},&*!|>'\"#%@`?~.0123456789\\x")), max_size=200)
EDGES = st.sampled_from([float("inf"), float("-inf"), float("nan"), -1, 0, 2**64, "", "\x00", "\n", "~"])
SCALARS = EDGES | st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
KEYS = st.sampled_from(
    [
        "base_model",
        "datasets",
        "lora_r",
        "runpod",
        "vastai",
        "local",
        "env",
        "path",
        "gpu_count",
        "output_dir",
    ]
) | st.text(max_size=8)
DATA = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=20,
)


def only_config_errors(data: bytes) -> None:
    try:
        parse_job(data, source="fuzz.yml", base_dir=REPO)
    except ConfigError as exc:
        assert exc.problems
        format_problems(exc)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(YAMLISH)
def test_yamlish_text_raises_only_config_errors(text: str) -> None:
    only_config_errors(text.encode())


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_config_errors(data: bytes) -> None:
    only_config_errors(data)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(DATA)
def test_arbitrary_data_raises_only_config_errors(data: Any) -> None:
    only_config_errors(yaml.safe_dump(data).encode())


SECTION_KEYS = sorted({k for m in section_models().values() for k in m.model_fields})
ENV = st.dictionaries(
    st.sampled_from(["A", "HF_TOKEN", "bad-name", ""]) | st.text(max_size=4), SCALARS | DATA
)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(
    st.sampled_from(list(provider_names())),
    st.dictionaries(st.sampled_from(SECTION_KEYS), SCALARS | DATA, max_size=4),
    ENV,
    st.dictionaries(st.sampled_from(["lora_r", "datasets", "output_dir", "resources_per_worker"]), DATA),
)
def test_arbitrary_values_for_known_keys_raise_only_config_errors(
    provider: ProviderName, section: Mapping[str, Any], env: Mapping[str, Any], train: Mapping[str, Any]
) -> None:
    doc = {
        "base_model": "m",
        "datasets": [{"path": "tatsu-lab/alpaca"}],
        **train,
        provider.value: {**section, "env": dict(env)},
    }
    only_config_errors(yaml.safe_dump(doc).encode())


def test_a_template_pod_that_never_starts_is_told_about_the_start_script_and_others_are_not() -> None:
    """The provision stage adds a section's `start_advice` to NODE_TIMEOUT's reason: a RunPod pod started
    from its template runs the template's command, which must run the fleet's start script."""
    template = parse(HEAD + "runpod:\n  template_id: tpl123\n").spec.section
    advice = template.start_advice()
    assert advice is not None and "template tpl123" in advice and "$FLEET_BOOTSTRAP" in advice
    own_image = parse(HEAD + "runpod:\n  template_id: tpl123\n  image: python:3.11\n").spec.section
    assert own_image.start_advice() is None
    assert parse(HEAD + "vastai:\n  gpu: RTX_A6000\n").spec.section.start_advice() is None
