"""The provider section's training switches (the proof of concept's `deepspeed`, `log_eval`,
`prepare_ds_only`) checked against the training config they switch: a switch the chosen trainer or the
job's shape cannot honour is refused with its key and line, never accepted and left unread.

- `deepspeed: true` trains with the fleet's ZeRO-2 config, which only axolotl runs, and only where there is
  something to shard (two GPUs or more); a config that names its own `deepspeed:` says it once, not twice.
- `log_eval: true` asks for the eval samples table, which needs an eval set and at least one row.
- `max_preemptions` counts spot machines lost: it means nothing for `pod_type: ON_DEMAND`.
- a fork of axolotl (`axolotl_git`) is for axolotl jobs, and replaces the release `axolotl_version` names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from core.errors import Problem
from jobs.problems import line_of
from jobs.sections.base import MachineSection, RemoteSection
from jobs.yamlsafe import join_path
from trainer.config import AxolotlConfig, TrainConfig

if TYPE_CHECKING:
    from jobs.spec import JobSpec


def switch_problems(spec: JobSpec, lines: Mapping[str, int]) -> list[Problem]:
    """What the section's switches ask and the job cannot do, as problems at the switch's key."""
    found: list[tuple[str, str]] = [
        *_deepspeed(spec),
        *_log_eval(spec),
        *_preemptions(spec),
        *_fork(spec),
    ]
    problems = []
    for key, message in found:
        where = join_path(spec.provider.value, key)
        problems.append(Problem(where, message, line_of(lines, where)))
    return problems


def _deepspeed(spec: JobSpec) -> list[tuple[str, str]]:
    section = spec.section
    if not isinstance(section, MachineSection) or not section.deepspeed:
        return []
    if isinstance(spec.train, TrainConfig):
        why = (
            "the builtin recipe does not train with DeepSpeed (it trains a LoRA adapter, one copy per "
            "GPU with DDP); set trainer: axolotl for DeepSpeed ZeRO-2, or drop deepspeed"
        )
        return [("deepspeed", why)]
    own = (spec.train.model_extra or {}).get("deepspeed")
    if own:
        why = (
            f"the training config names its own DeepSpeed config (deepspeed: {own}); the section's "
            "deepspeed: true would replace it with the fleet's ZeRO-2 one: keep one of the two"
        )
        return [("deepspeed", why)]
    gpus = spec.gpu_count * (section.num_nodes - 1) + spec.head_gpu_count
    if gpus < 2:
        why = (
            "DeepSpeed ZeRO shards the optimizer states and gradients across GPUs, and this job has "
            f"{gpus}; ask for gpu_count: 2 or more, or drop deepspeed"
        )
        return [("deepspeed", why)]
    return []


def _preemptions(spec: JobSpec) -> list[tuple[str, str]]:
    section = spec.section
    on_demand = isinstance(section, RemoteSection) and section.pod_type == "ON_DEMAND"
    if on_demand and "max_preemptions" in section.model_fields_set:
        why = "an on-demand machine is not preempted; set pod_type: INTERRUPTABLE or auto, or drop it"
        return [("max_preemptions", why)]
    return []


def _fork(spec: JobSpec) -> list[tuple[str, str]]:
    if spec.section.axolotl_fork() is None:
        return []
    if isinstance(spec.train, TrainConfig):
        return [
            (
                "axolotl_git",
                "installs a fork of axolotl, which the builtin recipe does not run: set trainer: axolotl",
            )
        ]
    if spec.train.axolotl_version:
        why = (
            f"installs a fork of axolotl, and the config asks for its release {spec.train.axolotl_version} "
            "(axolotl_version): keep one of the two"
        )
        return [("axolotl_git", why)]
    return []


def _log_eval(spec: JobSpec) -> list[tuple[str, str]]:
    if spec.section.log_eval is not True:
        return []
    train = spec.train
    extra = train.model_extra or {}
    if isinstance(train, AxolotlConfig):
        has_eval = bool(getattr(train, "val_set_size", None)) or bool(extra.get("test_datasets"))
        rows = extra.get("eval_table_size")
    else:
        has_eval, rows = train.val_set_size > 0, train.eval_table_size
    if not has_eval:
        message = "the eval samples table needs an eval set: set val_set_size (or test_datasets for axolotl)"
        return [("log_eval", message)]
    if rows == 0:
        return [("log_eval", "asks for the eval samples table, and eval_table_size: 0 asks for none")]
    return []
