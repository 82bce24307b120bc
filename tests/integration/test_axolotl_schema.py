"""`fleet validate` with axolotl's own config model (service.axolotl_check, trainer.axolotl_schema), run in
the axolotl environment (`make axolotl-env`): its verdict in the job file's key-and-line format."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from core.settings import Settings
from fleet.cli import cli
from jobs.spec import load_job
from providers.local.client import AXOLOTL_VENV
from service.axolotl_check import check
from tests.factories import REPO_ROOT

pytestmark = pytest.mark.integration
REAL = REPO_ROOT / "tests" / "data" / "axolotl"
AXOLOTL_PYTHON = REPO_ROOT / AXOLOTL_VENV / "bin" / "python"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    assert AXOLOTL_PYTHON.exists(), f"no axolotl environment at {AXOLOTL_PYTHON}: run `make axolotl-env`"
    return Settings(home=tmp_path, axolotl_python=AXOLOTL_PYTHON)


def test_axolotls_own_model_accepts_its_own_examples_and_names_what_it_no_longer_supports(
    settings: Settings,
) -> None:
    for name in ("lora-1b-ray", "lora-8b", "qlora", "chat-template", "deepspeed-zero2", "fsdp"):
        four_gpus = {"runpod": {"gpu_count": 4}} if name == "lora-1b-ray" else None  # its 4 Ray workers
        verdict = check(
            settings, load_job(REAL / f"{name}.yml", default_provider="runpod", overrides=four_gpus)
        )
        assert verdict is not None and verdict.version == "0.19.0" and verdict.problems == [], name
    # The proof of concept's 2023 config: a key axolotl 0.19 has dropped, found before anything is rented.
    verdict = check(settings, load_job(REAL / "minotaur.yml"))
    assert verdict is not None
    (problem,) = verdict.problems
    assert (problem.path, problem.line) == ("max_packed_sequence_len", 143)
    assert "no longer supported" in problem.message


def test_what_only_axolotl_checks_is_reported_with_key_and_line(settings: Settings, tmp_path: Path) -> None:
    job = tmp_path / "job.yml"
    job.write_text(  # axolotl requires learning_rate; trainfleet's own keys are fine
        "base_model: org/model\ndatasets:\n  - path: org/data\n    type: alpaca\nadapter: lora\n"
        "sample_packing: maybe\n"
    )
    verdict = check(settings, load_job(job))
    assert verdict is not None
    found = {(p.path, p.line) for p in verdict.problems}
    assert ("learning_rate", None) in found and ("sample_packing", 6) in found
    assert check(settings, load_job(REPO_ROOT / "configs" / "examples" / "tiny-lora.yml")) is None  # builtin


def test_fleet_validate_says_which_check_ran(tmp_path: Path) -> None:
    env = {"FLEET_HOME": str(tmp_path), "FLEET_AXOLOTL_PYTHON": str(AXOLOTL_PYTHON)}
    runner = CliRunner()
    # qlora.yml has no section: a rented GPU (a local node without GPUs refuses its 4-bit keys)
    checked = runner.invoke(cli, ["validate", "--provider", "runpod", str(REAL / "qlora.yml")], env=env)
    assert checked.exit_code == 0 and "checked with axolotl 0.19.0's own config model" in checked.output
    refused = runner.invoke(cli, ["validate", str(REAL / "minotaur.yml")], env=env)
    assert refused.exit_code == 1
    assert "minotaur.yml:143: max_packed_sequence_len: axolotl 0.19.0" in refused.output
    skipped = runner.invoke(cli, ["validate", "--no-axolotl-check", str(REAL / "minotaur.yml")], env=env)
    assert skipped.exit_code == 0 and "skipped (--no-axolotl-check)" in skipped.output
