"""Whether the job's node can run the job: checks of the validated job's training keys against its provider
section, run by `fleet validate` and again at submit, before anything is rented.

`node_problems` gathers every check's problems, each with the key path and its line in the job file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from core.errors import Problem
from jobs.dataset_check import dataset_problems
from jobs.gpu_keys import gpu_only_problems
from jobs.problems import line_of
from jobs.switches import switch_problems
from jobs.topology import topology_problems
from trainer.config import AxolotlConfig

if TYPE_CHECKING:
    from jobs.spec import JobSpec


def node_problems(spec: JobSpec, lines: Mapping[str, int]) -> list[Problem]:
    """What the job's node could never run, found before anything is rented."""
    return [
        *_axolotl_ray_without_gpus(spec, lines),
        *topology_problems(spec, lines),
        *gpu_only_problems(spec, lines),
        *dataset_problems(spec, lines),
        *switch_problems(spec, lines),
    ]


def _axolotl_ray_without_gpus(spec: JobSpec, lines: Mapping[str, int]) -> list[Problem]:
    train = spec.train
    if isinstance(train, AxolotlConfig) and train.use_ray and spec.gpu_count == 0:
        where = "use_ray"
        message = (
            "axolotl's Ray Train launcher takes one GPU per worker (use_gpu=True), and this job's node has "
            f"none ({spec.provider.value}); Ray would wait for GPUs forever. Ask for GPUs, or drop use_ray"
        )
        return [Problem(where, message, line_of(lines, where))]
    return []
