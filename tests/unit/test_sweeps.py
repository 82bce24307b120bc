"""A sweep section (or an axolotl sweep file) becomes validated child jobs; bad values are named where
they were written."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigError
from service.sweep_load import load_sweep
from service.sweep_spec import MAX_RUNS
from service.sweeps import table_lines
from state.payloads import SweepRow
from tests.factories import light_job_file


def job_with(tmp_path: Path, sweep: str) -> Path:
    job = light_job_file(tmp_path / "job")
    job.write_text(job.read_text() + sweep)
    return job


def problems(exc: pytest.ExceptionInfo[ConfigError]) -> list[tuple[str, str, int | None]]:
    return [(p.path, p.message, p.line) for p in exc.value.problems]


def line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_a_grid_is_every_combination_first_key_slowest(tmp_path: Path) -> None:
    job = job_with(
        tmp_path,
        "sweep:\n  grid:\n    learning_rate: [0.01, 0.02]\n    lora_r: [4, 8]\n  max_parallel: 2\n",
    )
    plan = load_sweep(job)
    assert plan.keys == ["learning_rate", "lora_r"]
    assert plan.params == [
        {"learning_rate": 0.01, "lora_r": 4},
        {"learning_rate": 0.01, "lora_r": 8},
        {"learning_rate": 0.02, "lora_r": 4},
        {"learning_rate": 0.02, "lora_r": 8},
    ]
    assert plan.section.max_parallel == 2 and plan.section.metric == "eval_loss"
    # Each child is the job with its values: the spec holds them, and no child carries the sweep on.
    assert [(j.spec.train.learning_rate, j.spec.train.lora_r) for j in plan.jobs] == [
        (0.01, 4),
        (0.01, 8),
        (0.02, 4),
        (0.02, 8),
    ]
    assert all(j.sweep is None and j.source == str(job) for j in plan.jobs)


def test_paired_sets_multiply_the_grid(tmp_path: Path) -> None:
    job = job_with(
        tmp_path,
        "sweep:\n  grid: {learning_rate: [0.01, 0.02]}\n"
        "  paired:\n    - {lora_r: 4, lora_alpha: 8}\n    - {lora_r: 16, lora_alpha: 32}\n",
    )
    plan = load_sweep(job)
    assert [(p["learning_rate"], p["lora_r"], p["lora_alpha"]) for p in plan.params] == [
        (0.01, 4, 8),
        (0.01, 16, 32),
        (0.02, 4, 8),
        (0.02, 16, 32),
    ]
    assert [j.spec.train.lora_alpha for j in plan.jobs] == [8, 32, 8, 32]


def test_random_search_is_reproducible_from_its_seed_and_stays_in_range(tmp_path: Path) -> None:
    sweep = (
        "sweep:\n  random:\n    n: 6\n    seed: 3\n    space:\n"
        "      learning_rate: {min: 1.0e-5, max: 1.0e-2, log: true}\n"
        "      lora_r: [4, 8, 16]\n      warmup_steps: {min: 0, max: 10}\n"
    )
    first = load_sweep(job_with(tmp_path / "a", sweep)).params
    again = load_sweep(job_with(tmp_path / "b", sweep)).params
    other = load_sweep(job_with(tmp_path / "c", sweep.replace("seed: 3", "seed: 4"))).params
    assert first == again and first != other and len(first) == 6
    for p in first:
        assert 1e-5 <= p["learning_rate"] <= 1e-2 and p["lora_r"] in (4, 8, 16)
        assert isinstance(p["warmup_steps"], int) and 0 <= p["warmup_steps"] <= 10


def test_axolotl_sweep_file_grid_and_underscore_pairs(tmp_path: Path) -> None:
    job = light_job_file(tmp_path / "job")
    sweep_file = tmp_path / "sweep.yml"
    sweep_file.write_text("learning_rate: [0.01, 0.03]\n_:\n  - {lora_r: 4}\n  - {lora_r: 8}\n")
    plan = load_sweep(job, sweep_file, max_parallel=3)
    assert plan.section.max_parallel == 3
    assert [(p["learning_rate"], p["lora_r"]) for p in plan.params] == [
        (0.01, 4),
        (0.01, 8),
        (0.03, 4),
        (0.03, 8),
    ]


def test_a_bad_value_is_reported_where_the_sweep_wrote_it(tmp_path: Path) -> None:
    job = job_with(tmp_path, "sweep:\n  grid:\n    learning_rate: [0.01, fast]\n    lora_r: [4, 0]\n")
    with pytest.raises(ConfigError) as exc:
        load_sweep(job)
    found = problems(exc)
    assert exc.value.source == str(job)
    lr_line, r_line = line_of(job, "learning_rate: [0.01, fast]"), line_of(job, "lora_r: [4, 0]")
    assert ("sweep.grid.learning_rate[1]", 'must be a number (got "fast")', lr_line) in found
    assert any(path == "sweep.grid.lora_r[1]" and line == r_line for path, _m, line in found)
    assert len(found) == 2  # each bad value once, however many children share it


def test_a_bad_value_in_a_sweep_file_names_that_file(tmp_path: Path) -> None:
    job = light_job_file(tmp_path / "job")
    sweep_file = tmp_path / "sweep.yml"
    sweep_file.write_text("lora_r: [4, 8]\n_:\n  - {lora_dropout: 0.1}\n  - {lora_dropout: lots}\n")
    with pytest.raises(ConfigError) as exc:
        load_sweep(job, sweep_file)
    assert exc.value.source == str(sweep_file)
    assert [(p, line) for p, _m, line in problems(exc)] == [("_[1].lora_dropout", 4)]


@pytest.mark.parametrize(
    ("sweep", "path", "message"),
    [
        ("sweep:\n  grid: {learning_rte: [0.1]}\n", "sweep.grid.learning_rte", "did you mean"),
        ("sweep:\n  grid: {local: [1]}\n", "sweep.grid.local", "cannot be swept"),
        ("sweep:\n  grid: {lora_r: 8}\n", "sweep.grid.lora_r", "must be a list"),
        ("sweep:\n  grid: {lora_r: []}\n", "sweep.grid.lora_r", "at least 1 item"),
        ("sweep:\n  grid: {lora_r: [8]}\n  random: {n: 2, space: {lora_r: [8]}}\n", "sweep", "not both"),
        ("sweep:\n  max_parallel: 2\n", "sweep", "needs grid, random or paired"),
        ("sweep:\n  grid: {lora_r: [8]}\n  max_paralel: 2\n", "sweep.max_paralel", "unknown key"),
        ("sweep:\n  grid: {lora_r: [8]}\n  max_parallel: 0\n", "sweep.max_parallel", "between 1 and 64"),
        ("sweep:\n  grid: {lora_r: [8]}\n  goal: lowest\n", "sweep.goal", "must be one of"),
        ("sweep:\n  grid: {lora_r: [4]}\n  paired: [{lora_r: 8}]\n", "sweep.paired[0].lora_r", "both grid"),
    ],
)
def test_bad_sweep_sections_name_the_key_and_line(
    tmp_path: Path, sweep: str, path: str, message: str
) -> None:
    job = job_with(tmp_path, sweep)
    with pytest.raises(ConfigError) as exc:
        load_sweep(job)
    found = problems(exc)
    assert any(p == path and message in m and line is not None for p, m, line in found), found


def test_too_many_runs_is_refused_before_any_is_built(tmp_path: Path) -> None:
    values = ", ".join(str(i) for i in range(1, 20))
    job = job_with(tmp_path, f"sweep:\n  grid:\n    lora_r: [{values}]\n    warmup_steps: [{values}]\n")
    with pytest.raises(ConfigError) as exc:
        load_sweep(job)
    assert f"the sweep has 361 runs; the limit is {MAX_RUNS}" in str(exc.value)


def test_a_file_without_a_sweep_or_with_two_is_refused(tmp_path: Path) -> None:
    plain = light_job_file(tmp_path / "plain")
    with pytest.raises(ConfigError, match="no sweep"):
        load_sweep(plain)
    both = job_with(tmp_path / "both", "sweep:\n  grid: {lora_r: [4]}\n")
    sweep_file = tmp_path / "sweep.yml"
    sweep_file.write_text("lora_r: [8]\n")
    with pytest.raises(ConfigError, match="given twice"):
        load_sweep(both, sweep_file)


def test_the_text_table_marks_the_best_row() -> None:
    rows = [
        SweepRow(index=0, run_id="r1", state="SUCCEEDED", params={"lora_r": 4}, metric=1.5),
        SweepRow(index=1, run_id="r2", state="SUCCEEDED", params={"lora_r": 8}, metric=1.25, best=True),
        SweepRow(index=2, run_id="r3", state="FAILED", params={"lora_r": 16}, metric=None),
    ]
    lines = table_lines(["lora_r"], rows, "eval_loss")
    assert lines[0].split() == ["run", "state", "lora_r", "eval_loss"]
    assert lines[2].startswith("*") and "r2" in lines[2] and "1.25" in lines[2]
    assert not lines[1].startswith("*") and lines[3].split()[-1] == "-"


def test_children_may_not_share_a_hub_repo_or_a_wandb_run(tmp_path: Path) -> None:
    job = job_with(tmp_path, "hub_model_id: me/tiny\nwandb_run_id: mine\nsweep:\n  grid: {lora_r: [4, 8]}\n")
    with pytest.raises(ConfigError) as exc:
        load_sweep(job)
    found = problems(exc)
    assert [(p, line) for p, _m, line in found] == [
        ("hub_model_id", line_of(job, "hub_model_id: me/tiny")),
        ("wandb_run_id", line_of(job, "wandb_run_id: mine")),
    ]
    assert "same hub repo" in found[0][1]
    paired = job_with(
        tmp_path / "ok",
        "sweep:\n  paired:\n"
        "    - {lora_r: 4, hub_model_id: me/tiny-r4}\n    - {lora_r: 8, hub_model_id: me/tiny-r8}\n",
    )
    assert [j.spec.train.hub_model_id for j in load_sweep(paired).jobs] == ["me/tiny-r4", "me/tiny-r8"]
