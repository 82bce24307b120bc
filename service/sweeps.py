"""Sweeps: one job file, many runs that differ in a few training keys.

A sweep is given either as a `sweep:` section in the job file::

    sweep:
      grid: {learning_rate: [1.0e-4, 2.0e-4], lora_r: [8, 16]}   # every combination (4 runs)
      paired: [{lora_r: 8, lora_alpha: 16}, {lora_r: 16, lora_alpha: 32}]   # ...times each of these sets
      random: {n: 8, seed: 0, space: {learning_rate: {min: 1.0e-5, max: 1.0e-3, log: true}}}
      max_parallel: 2          # at most this many children active at once (default 1)
      metric: eval_loss        # the final metric the table ranks by
      goal: minimize

(`grid` and `random` exclude each other; `paired` combines with either), or as a separate file in axolotl's
`--sweep` format: each key a list of values (the grid), plus `_`: a list of paired settings.

Every child is validated as the job it will be before anything is written, and a bad value is reported
where it was written (``sweep.grid.learning_rate[1]`` and its line). Each child is an ordinary run (its own
node, its own events) that records the sweep and the values it set.
"""

from __future__ import annotations

import difflib
import itertools
import math
import random
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from broker import sweeps as ledger_sweeps
from broker.cost import run_cost
from broker.models import Event, EventType, Sweep
from core.errors import ConfigError, Problem
from jobs.sections import ProviderName
from jobs.spec import LoadedJob, line_of, parse_job, validate_mapping
from jobs.yamlsafe import MAX_BYTES, join_path, load_yaml
from service import runs
from service.runs import Fleet
from trainer.config import TrainConfig

MAX_RUNS = 256  # the most children one sweep may have
MAX_PARALLEL = 64
SWEEP_PREFIX = "sw-"
NOT_SWEPT = frozenset({"sweep", *(p.value for p in ProviderName)})


class Range(BaseModel):
    """A random search range: uniform between min and max (log-uniform with `log`); whole numbers when
    both bounds are whole numbers and `log` is off."""

    model_config = ConfigDict(extra="forbid")

    min: float | int
    max: float | int
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if not self.max > self.min:
            raise ValueError(f"max ({self.max}) must be greater than min ({self.min})")
        if self.log and self.min <= 0:
            raise ValueError("a log range needs min > 0")
        return self

    def draw(self, rng: random.Random) -> float | int:
        if self.log:
            return _round(math.exp(rng.uniform(math.log(self.min), math.log(self.max))))
        if isinstance(self.min, int) and isinstance(self.max, int):
            return rng.randint(self.min, self.max)
        return _round(rng.uniform(self.min, self.max))


class RandomSearch(BaseModel):
    """`n` children, each key drawn from its list of values or its range, reproducibly from `seed`."""

    model_config = ConfigDict(extra="forbid")

    n: int = Field(ge=1, le=MAX_RUNS)
    seed: int = 0
    space: dict[str, Annotated[list[Any], Field(min_length=1)] | Range] = Field(min_length=1)


class SweepSection(BaseModel):
    """The `sweep:` section of a job file."""

    model_config = ConfigDict(extra="forbid")

    grid: dict[str, Annotated[list[Any], Field(min_length=1)]] = Field(default_factory=dict)
    paired: list[Annotated[dict[str, Any], Field(min_length=1)]] = Field(default_factory=list)
    random: RandomSearch | None = None
    max_parallel: int = Field(1, ge=1, le=MAX_PARALLEL)
    metric: str = Field("eval_loss", min_length=1)
    goal: Literal["minimize", "maximize"] = "minimize"

    @model_validator(mode="after")
    def _one_kind(self) -> SweepSection:
        if self.grid and self.random is not None:
            raise ValueError("give either grid or random, not both")
        if not (self.grid or self.paired or self.random is not None):
            raise ValueError("a sweep needs grid, random or paired values")
        return self


@dataclass(frozen=True)
class Layout:
    """Where a sweep's values were written: the file, and the key path under which each kind of value is."""

    source: str
    lines: Mapping[str, int]
    grid_at: str
    paired_at: str
    random_at: str

    def grid_key(self, key: str) -> str:
        return join_path(self.grid_at, key)

    def grid(self, key: str, j: int) -> str:
        return join_path(self.grid_key(key), j)

    def paired(self, i: int, key: str) -> str:
        return join_path(join_path(self.paired_at, i), key)

    def random(self, key: str) -> str:
        return join_path(self.random_at, key)


def _section_layout(source: str, lines: Mapping[str, int]) -> Layout:
    return Layout(source, lines, "sweep.grid", "sweep.paired", "sweep.random.space")


def _axolotl_layout(source: str, lines: Mapping[str, int]) -> Layout:
    """axolotl's file: the grid's keys at the top, the paired sets under `_`, no random search."""
    return Layout(source, lines, "", "_", "")


@dataclass(frozen=True)
class Child:
    """One run of a sweep: the values it sets (key -> value) and where each was written (key -> path)."""

    params: dict[str, Any]
    where: dict[str, str]


@dataclass(frozen=True)
class SweepPlan:
    """A validated sweep: its settings, and each child as the job it will be submitted as."""

    source: str
    section: SweepSection
    keys: list[str]
    jobs: list[LoadedJob]
    params: list[dict[str, Any]]
    warnings: list[str]


def load_sweep(
    path: Path,
    sweep_file: Path | None = None,
    *,
    default_provider: str = "local",
    max_parallel: int | None = None,
) -> SweepPlan:
    """Read a job file and its sweep (its `sweep:` section, or `sweep_file` in axolotl's format) and
    validate every child. Raises ConfigError naming the file, key and line of each problem."""
    data = _read(path)
    sweep_data = _read(sweep_file) if sweep_file is not None else None
    return parse_sweep(
        data,
        source=str(path),
        base_dir=path.absolute().parent,
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
) -> SweepPlan:
    """`load_sweep` on bytes (the bot's attachments)."""
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
    jobs = _child_jobs(data, source, base_dir, default_provider, children, layout)
    _check_distinct(jobs, source, doc.lines)
    warnings = sorted({w for job in jobs for w in job.warnings})
    return SweepPlan(source, section, keys, jobs, [c.params for c in children], warnings)


def _read(path: Path) -> bytes:
    try:
        if path.stat().st_size > MAX_BYTES:
            raise ConfigError(str(path), [Problem("", f"file is larger than {MAX_BYTES} bytes")])
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(str(path), [Problem("", f"cannot read the file: {exc.strerror or exc}")]) from None


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
    paired: list[dict[str, Any]] = []
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
        if key in NOT_SWEPT:
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


def size(section: SweepSection) -> int:
    """How many children the sweep has."""
    points = section.random.n if section.random else math.prod(len(v) for v in section.grid.values())
    return points * max(1, len(section.paired))


def expand(section: SweepSection, layout: Layout) -> list[Child]:
    """Every child, in order: the grid's combinations (first key slowest) or the random draws, each
    combined with each paired set."""
    count = size(section)
    if count > MAX_RUNS:
        message = f"the sweep has {count} runs; the limit is {MAX_RUNS}"
        raise ConfigError(layout.source, [Problem("", message)])
    points: list[Child] = []
    if section.random is not None:
        rng = random.Random(section.random.seed)
        for _ in range(section.random.n):
            params, where = {}, {}
            for key, space in section.random.space.items():
                if isinstance(space, Range):
                    params[key], where[key] = space.draw(rng), layout.random(key)
                else:
                    j = rng.randrange(len(space))
                    params[key], where[key] = space[j], join_path(layout.random(key), j)
            points.append(Child(params, where))
    else:
        keys = list(section.grid)
        for combo in itertools.product(*(range(len(section.grid[k])) for k in keys)):
            params = {k: section.grid[k][j] for k, j in zip(keys, combo, strict=True)}
            where = {k: layout.grid(k, j) for k, j in zip(keys, combo, strict=True)}
            points.append(Child(params, where))
    if not section.paired:
        return points
    children = []
    for point in points:
        for i, pairs in enumerate(section.paired):
            params = {**point.params, **pairs}
            where = {**point.where, **{k: layout.paired(i, k) for k in pairs}}
            children.append(Child(params, where))
    return children


def _child_jobs(
    data: bytes,
    source: str,
    base_dir: Path,
    default_provider: str,
    children: list[Child],
    layout: Layout,
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


def _round(value: float) -> float:
    """Four significant digits: a drawn learning rate reads 0.0002315, not 0.00023147962."""
    return float(f"{value:.4g}")


# ---- the fleet side ---------------------------------------------------------------------------------
def new_sweep_id() -> str:
    return SWEEP_PREFIX + time.strftime("%y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def submit_sweep(fleet: Fleet, plan: SweepPlan) -> Sweep:
    """Record the sweep and every child (all waiting), then release the first `max_parallel`."""
    for job in plan.jobs:
        runs.check_submittable(fleet.settings, job)
    runs.check_budget(fleet)
    run_ids: list[str] = []
    while len(run_ids) < len(plan.jobs):
        if (run_id := runs.new_run_id()) not in run_ids:
            run_ids.append(run_id)
    section = plan.section
    sweep = Sweep(
        sweep_id=new_sweep_id(),
        source=plan.source,
        max_parallel=section.max_parallel,
        metric=section.metric,
        goal=section.goal,
        keys=plan.keys,
        runs=run_ids,
    )
    started = {
        "sweep_id": sweep.sweep_id,
        "source": sweep.source,
        "runs": run_ids,
        "keys": sweep.keys,
        "max_parallel": sweep.max_parallel,
    }
    event = Event(id=f"{sweep.sweep_id}-started", type=EventType.SWEEP_STARTED, data=started)
    fleet.ledger.create_sweep(sweep, event)
    for run_id, job, params in zip(run_ids, plan.jobs, plan.params, strict=True):
        runs.submit(fleet, job, run_id=run_id, sweep_id=sweep.sweep_id, params=params, held=True)
    ledger_sweeps.advance(fleet.ledger, fleet.dispatcher, sweep.sweep_id)
    return fleet.ledger.get_sweep(sweep.sweep_id)


def cancel_sweep(fleet: Fleet, sweep_id: str) -> Sweep:
    """Cancel every child that has not ended (waiting ones never start); the sweep ends CANCELLED."""
    sweep = fleet.ledger.find_sweep(sweep_id)

    def flag(s: Sweep) -> Event | None:
        s.cancel_requested = True
        return None

    sweep = fleet.ledger.update_sweep(sweep.sweep_id, flag)
    for run in fleet.ledger.get_runs(sweep.runs).values():
        if not run.state.is_terminal():
            runs.cancel(fleet, run.run_id)
    ledger_sweeps.advance(fleet.ledger, fleet.dispatcher, sweep.sweep_id)
    return fleet.ledger.get_sweep(sweep.sweep_id)


def sweep_view(fleet: Fleet, sweep: Sweep) -> dict[str, Any]:
    """A sweep as `fleet status SWEEP --json` prints it: its settings, state and table."""
    runs = fleet.ledger.get_runs(sweep.runs)
    children = [runs[r] for r in sweep.runs if r in runs]
    rows = ledger_sweeps.table(sweep, children)
    best = next((r["run_id"] for r in rows if r["best"]), None)
    return {
        "sweep_id": sweep.sweep_id,
        "state": ledger_sweeps.sweep_state(sweep, children),
        "source": sweep.source,
        "created_at": sweep.created_at,
        "finished_at": sweep.finished_at,
        "max_parallel": sweep.max_parallel,
        "metric": sweep.metric,
        "goal": sweep.goal,
        "keys": sweep.keys,
        "cancel_requested": sweep.cancel_requested,
        "rows": rows,
        "best": best,
        "cost_usd": round(sum(run_cost(fleet.ledger, run) for run in children), 4),
    }


def table_lines(keys: list[str], rows: list[dict[str, Any]], metric: str) -> list[str]:
    """The sweep's table as fixed-width text (Discord code blocks, plain terminals); the best row starts
    with '*'."""
    header = ["", "run", "state", *keys, metric]
    body = [
        [
            "*" if row["best"] else "",
            row["run_id"],
            row["state"],
            *(format_value(row["params"].get(k)) for k in keys),
            format_value(row["metric"]),
        ]
        for row in rows
    ]
    widths = [max(len(cells[i]) for cells in [header, *body]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
        for cells in [header, *body]
    ]


def format_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
