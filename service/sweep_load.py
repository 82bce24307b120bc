"""Sweeps: one job file, many runs that differ in a few training keys. This reads a job file's `sweep:`
section (or a sweep file in axolotl's `--sweep` format) into a `SweepPlan` (service/sweep_spec.py says what
a sweep is).

Every child is validated as the job it will be before anything is written, and a bad value is reported
where it was written (``sweep.grid.learning_rate[1]`` and its line). Each child is an ordinary run (its own
node, its own events) that records the sweep and the values it set.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import JsonValue

from core.errors import ConfigError, Problem
from jobs.clouds import provider_names
from jobs.paths import Confinement
from jobs.problems import line_of, validate_mapping
from jobs.spec import LoadedJob, parse_job
from jobs.yamlsafe import load_yaml, read_job_file
from service.sweep_spec import Child, Layout, SweepPlan, SweepSection, expand
from trainer.config import TrainConfig


def _section_layout(source: str, lines: Mapping[str, int]) -> Layout:
    return Layout(source, lines, "sweep.grid", "sweep.paired", "sweep.random.space")


def _axolotl_layout(source: str, lines: Mapping[str, int]) -> Layout:
    """axolotl's file: the grid's keys at the top, the paired sets under `_`, no random search."""
    return Layout(source, lines, "", "_", "")


def load_sweep(
    path: Path,
    sweep_file: Path | None = None,
    *,
    default_provider: str = "local",
    max_parallel: int | None = None,
    data_roots: Sequence[Path] = (),
) -> SweepPlan:
    """Read a job file and its sweep (its `sweep:` section, or `sweep_file` in axolotl's format) and
    validate every child. Raises ConfigError naming the file, key and line of each problem. Local files
    must be beside the job file or under `data_roots` (jobs.paths)."""
    data = read_job_file(path)
    sweep_data = read_job_file(sweep_file) if sweep_file is not None else None
    return parse_sweep(
        data,
        source=str(path),
        base_dir=path.absolute().parent,
        paths=Confinement(path.absolute().parent, tuple(data_roots)),
        sweep_data=sweep_data,
        sweep_source=str(sweep_file) if sweep_file is not None else None,
        default_provider=default_provider,
        max_parallel=max_parallel,
    )


def parse_sweep(
    data: bytes,
    *,
    source: str,
    base_dir: Path,
    sweep_data: bytes | None = None,
    sweep_source: str | None = None,
    default_provider: str = "local",
    max_parallel: int | None = None,
    paths: Confinement | None = None,
) -> SweepPlan:
    """`load_sweep` on bytes (the bot's attachments); `paths` as for jobs.spec.parse_job."""
    doc = load_yaml(data, source=source)
    if not isinstance(doc.data, dict):
        parse_job(data, source=source, base_dir=base_dir, default_provider=default_provider)  # says why
        raise ConfigError(source, [Problem("", "a job file is a mapping of keys")])
    in_file = "sweep" in doc.data
    if sweep_data is not None:
        sweep_name = sweep_source or "sweep file"
        if in_file:
            message = f"the sweep is given twice: here and in {sweep_name}; keep one"
            raise ConfigError(source, [Problem("sweep", message, doc.lines.get("sweep"))])
        sweep_doc = load_yaml(sweep_data, source=sweep_name)
        layout = _axolotl_layout(sweep_name, sweep_doc.lines)
        section = _from_axolotl(sweep_doc.data, layout)
    else:
        if not in_file:
            message = "no sweep: add a `sweep:` section (grid, random or paired) or give a sweep file"
            raise ConfigError(source, [Problem("", message)])
        layout = _section_layout(source, doc.lines)
        problems: list[Problem] = []
        section = validate_mapping(SweepSection, doc.data["sweep"] or {}, "sweep", doc.lines, problems)
        if section is None:
            raise ConfigError(source, problems)
    if max_parallel is not None:
        section = section.model_copy(update={"max_parallel": max_parallel})
    keys = _check_keys(section, layout)
    children = expand(section, layout)
    jobs = _child_jobs(data, source, base_dir, default_provider, children, layout, paths)
    _check_distinct(jobs, source, doc.lines)
    warnings = sorted({w for job in jobs for w in job.warnings})
    return SweepPlan(source, section, keys, jobs, [c.params for c in children], warnings)


# Keys that name one thing outside the fleet: children sharing a value would overwrite each other's result.
MUST_DIFFER = {
    "hub_model_id": "every run of the sweep would push to the same hub repo",
    "wandb_run_id": "every run of the sweep would write to the same W&B run",
}


def _check_distinct(jobs: list[LoadedJob], source: str, lines: Mapping[str, int]) -> None:
    problems = []
    for key, why in MUST_DIFFER.items():
        values = [getattr(job.spec.train, key) for job in jobs]
        if len(values) > 1 and any(values) and len(set(values)) < len(values):
            message = f"{why}; sweep {key} too (e.g. in paired) or leave it out"
            problems.append(Problem(key, message, line_of(lines, key) or line_of(lines, "sweep")))
    if problems:
        raise ConfigError(source, problems)


def _key_of(path: str) -> str:
    return path.split(".", 1)[0].split("[", 1)[0]


def _from_axolotl(data: Any, layout: Layout) -> SweepSection:
    """axolotl's sweep file: `key: [values...]` for the grid, `_: [{key: value, ...}, ...]` for pairs."""
    lines, source = layout.lines, layout.source
    if not isinstance(data, dict):
        message = "a sweep file is a mapping: each key a list of values, and `_` a list of paired settings"
        raise ConfigError(source, [Problem("", message, 1)])
    problems = []
    grid: dict[str, list[Any]] = {}
    paired: list[dict[str, JsonValue]] = []
    for key, values in data.items():
        if key == "_":
            if not isinstance(values, list) or not all(isinstance(v, dict) and v for v in values):
                problems.append(Problem("_", "must be a list of mappings (key: value)", lines.get("_")))
            else:
                paired = values
        elif not isinstance(values, list) or not values:
            message = "must be a list of values to sweep over (max_parallel, metric: use the flags)"
            problems.append(Problem(key, message, lines.get(key)))
        else:
            grid[key] = values
    if problems:
        raise ConfigError(source, problems)
    if not grid and not paired:
        raise ConfigError(source, [Problem("", "the sweep file sets no values", 1)])
    return SweepSection(grid=grid, paired=paired)


def _check_keys(section: SweepSection, layout: Layout) -> list[str]:
    """The swept keys in order; each must be a training key trainfleet knows (a typo would otherwise pass
    through unused, and every child would be the same run)."""
    places: dict[str, str] = {}
    for key in section.grid:
        places.setdefault(key, layout.grid_key(key))
    for i, pairs in enumerate(section.paired):
        for key in pairs:
            if key in section.grid:
                message = f"{key!r} is in both grid and paired; set it in one of them"
                raise ConfigError(layout.source, [_problem(layout, layout.paired(i, key), message)])
            places.setdefault(key, layout.paired(i, key))
    for key in section.random.space if section.random else {}:
        places.setdefault(key, layout.random(key))
    problems = []
    known = list(TrainConfig.model_fields)
    for key, where in places.items():
        if key == "sweep" or key in provider_names():
            problems.append(_problem(layout, where, f"a sweep sets training keys; {key!r} cannot be swept"))
        elif key not in TrainConfig.model_fields:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(_problem(layout, where, f"unknown training key {key!r}{hint}"))
    if problems:
        raise ConfigError(layout.source, problems)
    return list(places)


def _problem(layout: Layout, path: str, message: str) -> Problem:
    return Problem(path, message, line_of(layout.lines, path))


def _child_jobs(
    data: bytes,
    source: str,
    base_dir: Path,
    default_provider: str,
    children: list[Child],
    layout: Layout,
    paths: Confinement | None,
) -> list[LoadedJob]:
    """Each child validated as its own job; a bad value is reported where the sweep wrote it, a problem of
    the job file itself once, against the job file."""
    jobs: list[LoadedJob] = []
    in_sweep: list[Problem] = []
    in_job: list[Problem] = []
    for index, child in enumerate(children):
        try:
            job = parse_job(
                data,
                source=f"{source} (sweep run {index + 1})",
                base_dir=base_dir,
                default_provider=default_provider,
                overrides=child.params,
                paths=paths,
            )
        except ConfigError as exc:
            for p in exc.problems:
                key = _key_of(p.path)
                if key in child.where:
                    found, into = _problem(layout, child.where[key] + p.path[len(key) :], p.message), in_sweep
                else:
                    found, into = p, in_job
                if found not in into:
                    into.append(found)
            continue
        jobs.append(replace(job, source=source, sweep=None))
    if in_job:
        raise ConfigError(source, in_job)
    if in_sweep:
        raise ConfigError(layout.source, in_sweep)
    return jobs
