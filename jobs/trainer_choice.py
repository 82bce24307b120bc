"""Which trainer runs a job: the builtin LoRA recipe or axolotl itself.

A job may say so (`trainer: builtin | axolotl`). When it does not, the builtin recipe is chosen only when
it implements every training key the job sets, and axolotl otherwise; the keys that forced axolotl are
kept for `fleet validate` to show. A key the chosen trainer would ignore is an error, never a silent
pass-through:

- `trainer: builtin` with a key the recipe does not implement (`optimizer: adafactor`, `sample_packing: true`,
  `datasets[0].type: pygmalion`, no `adapter`, which in axolotl means the full model) names each one;
- `trainer: axolotl` with a key only the builtin recipe has (`loss_watchdog_max_rollbacks`) names it.

A key set to null, false or an empty value asks for nothing, so it never forces axolotl, and bookkeeping
keys that change nothing in training (`strict`, `tokenizer_type`, ...) pass the builtin recipe with one
warning.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.errors import Problem
from jobs.problems import line_of
from jobs.yamlsafe import join_path
from trainer.config import (
    FLEET_KEYS,
    DatasetConfig,
    DatasetType,
    Optimizer,
    Scheduler,
    TrainConfig,
    TrainerName,
)

# Keys axolotl configs carry that change nothing in what or how the builtin recipe trains.
BOOKKEEPING = frozenset(
    {
        "strict",
        "debug",
        "dataset_prepared_path",
        "dataset_processes",
        "tokenizer_type",
        "model_type",
        "is_llama_derived_model",
        "is_mistral_derived_model",
        "is_falcon_derived_model",
        "is_qwen_derived_model",
        "local_rank",
        "use_wandb",
        "hf_use_auth_token",
        "logging_dir",
    }
)
BUILTIN_ONLY = ("loss_watchdog_max_rollbacks", "ray_max_failures")  # axolotl would ignore these
_KNOWN = frozenset(TrainConfig.model_fields) | frozenset(FLEET_KEYS)  # the builtin's keys, and the fleet's
_CHOICES: tuple[TrainerName, ...] = ("builtin", "axolotl")


@dataclass(frozen=True)
class TrainerChoice:
    """The trainer a job runs with, and why."""

    trainer: TrainerName
    explicit: bool
    """Whether the job named it (`trainer:`) rather than trainfleet choosing it."""
    forced_by: tuple[str, ...] = ()
    """The settings the builtin recipe does not implement (``optimizer: adafactor``): why axolotl."""
    bookkeeping: tuple[str, ...] = ()
    """Keys the builtin recipe keeps without using them (warned about once)."""

    def describe(self) -> str:
        """One line for people: ``trainer: axolotl (chosen: it implements optimizer: adafactor, ...)``."""
        if self.explicit:
            return f"trainer: {self.trainer} (the job's `trainer:` key)"
        if self.trainer == "builtin":
            return "trainer: builtin (chosen: the builtin recipe implements every training key of the job)"
        shown = ", ".join(self.forced_by[:8]) + (
            f" and {len(self.forced_by) - 8} more" if len(self.forced_by) > 8 else ""
        )
        return f"trainer: axolotl (chosen: the builtin recipe does not implement {shown})"


def choose(raw: Mapping[str, Any], lines: Mapping[str, int]) -> tuple[TrainerChoice | None, list[Problem]]:
    """The trainer for the training keys `raw` (the job without its provider section), and the problems
    with it: a named trainer with keys it would ignore, or keys only each trainer has. None only for a
    trainer that does not exist."""
    named = raw.get("trainer")
    if named is not None and named not in _CHOICES:
        message = f"unknown trainer {named!r}; valid: {', '.join(_CHOICES)}"
        return None, [Problem("trainer", message, line_of(lines, "trainer"))]
    gaps = builtin_gaps(raw)
    only_builtin = [key for key in BUILTIN_ONLY if key in raw and raw[key] is not None]
    bookkeeping = tuple(
        key for key in raw if key in BOOKKEEPING or (key not in _KNOWN and _asks_nothing(raw[key]))
    )
    trainer: TrainerName = named if named is not None else ("axolotl" if gaps else "builtin")
    problems = []
    if trainer == "builtin" and gaps:
        for path, setting in gaps:
            message = (
                f"the builtin recipe does not implement {setting}, so it would be ignored; "
                "use `trainer: axolotl`, or remove it"
            )
            problems.append(Problem(path, message, line_of(lines, path)))
    if trainer == "axolotl":
        why = "axolotl has no such key" + (
            "" if named else f" (axolotl was chosen for {gaps[0][1]})" if gaps else ""
        )
        for key in only_builtin:
            message = f"only the builtin recipe implements {key}; {why}"
            problems.append(Problem(key, message, line_of(lines, key)))
    choice = TrainerChoice(
        trainer=trainer,
        explicit=named is not None,
        forced_by=tuple(setting for _, setting in gaps) if trainer == "axolotl" else (),
        bookkeeping=bookkeeping if trainer == "builtin" else (),
    )
    return choice, problems


def builtin_gaps(raw: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every (key path, setting) of `raw` that the builtin recipe does not implement: what it would train
    differently first (adapter, optimizer, schedule, dataset formats), then the keys it has not got."""
    gaps: list[tuple[str, str]] = []
    if raw.get("adapter") in (None, ""):
        gaps.append(("adapter", "training the whole model (no `adapter:`)"))
    for key, allowed in (
        ("adapter", ("lora", "qlora")),
        ("optimizer", _args(Optimizer)),
        ("lr_scheduler", _args(Scheduler)),
    ):
        value = raw.get(key)
        if value not in (None, "") and value not in allowed:
            gaps.append((key, _setting(key, value)))
    datasets = raw.get("datasets")
    for i, entry in enumerate(datasets if isinstance(datasets, list) else []):
        if not isinstance(entry, dict):
            continue
        for key, value in entry.items():
            where = join_path(join_path("datasets", i), key)
            other_format = key == "type" and value is not None and value not in _args(DatasetType)
            unknown = key not in DatasetConfig.model_fields and not _asks_nothing(value)
            if other_format or unknown:
                gaps.append((where, _setting(where, value)))
    for key, value in raw.items():
        if key in _KNOWN or key in BOOKKEEPING:
            continue
        if not _asks_nothing(value):
            gaps.append((key, _setting(key, value)))
    return gaps


def _asks_nothing(value: Any) -> bool:
    """null, false or empty: a key set this way turns nothing on."""
    return value is None or value is False or (isinstance(value, str | list | dict) and not value)


def _args(literal: Any) -> tuple[str, ...]:
    return tuple(typing.get_args(literal))


def _setting(key: str, value: Any) -> str:
    return key if value is True else f"{key}: {_short(value)}"


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
