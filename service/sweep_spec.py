"""What a sweep is: its settings, where its values were written, and its children (the grid's combinations
or the random draws, times the paired sets). Reading and validating a sweep is service/sweep_load.py;
submitting one, service/sweeps.py.

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
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from core.errors import ConfigError, Problem
from jobs.spec import LoadedJob
from jobs.yamlsafe import join_path

MAX_RUNS = 256  # the most children one sweep may have
MAX_PARALLEL = 64


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
    paired: list[Annotated[dict[str, JsonValue], Field(min_length=1)]] = Field(default_factory=list)
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


@dataclass(frozen=True)
class Child:
    """One run of a sweep: the values it sets (key -> value) and where each was written (key -> path)."""

    params: dict[str, JsonValue]
    where: dict[str, str]


@dataclass(frozen=True)
class SweepPlan:
    """A validated sweep: its settings, and each child as the job it will be submitted as."""

    source: str
    section: SweepSection
    keys: list[str]
    jobs: list[LoadedJob]
    params: list[dict[str, JsonValue]]
    warnings: list[str]


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
            params: dict[str, JsonValue] = {}
            where: dict[str, str] = {}
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
            points.append(
                Child(
                    {k: section.grid[k][j] for k, j in zip(keys, combo, strict=True)},
                    {k: layout.grid(k, j) for k, j in zip(keys, combo, strict=True)},
                )
            )
    if not section.paired:
        return points
    children = []
    for point in points:
        for i, pairs in enumerate(section.paired):
            children.append(
                Child({**point.params, **pairs}, {**point.where, **{k: layout.paired(i, k) for k in pairs}})
            )
    return children


def _round(value: float) -> float:
    """Four significant digits: a drawn learning rate reads 0.0002315, not 0.00023147962."""
    return float(f"{value:.4g}")
