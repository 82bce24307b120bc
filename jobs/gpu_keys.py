"""Training keys that cannot run on a CPU, refused at validate for a node without GPUs (before renting).

A key is refused only where a CPU cannot do what it asks, for either trainer (each key means the same in
both): bitsandbytes' 4/8-bit loading and its optimizers, FlashAttention 2, TensorFloat-32 (a CUDA matmul
setting; the HF Trainer itself refuses `tf32` without a GPU). What a CPU runs is allowed: bf16 and fp16
autocast (torch 2.13 runs both on a CPU, fp16 with a GradScaler), gradient checkpointing, sdp attention.
The node checks the same again when the run starts (trainer.precision.check_node).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from core.errors import Problem
from jobs.problems import line_of
from jobs.sections import LocalSection
from trainer.precision import BNB_OPTIMIZERS

if TYPE_CHECKING:
    from jobs.spec import JobSpec

# key -> what it needs that only a CUDA GPU has (a key set to true, or the optimizers by name)
GPU_ONLY: Mapping[str, str] = {
    "load_in_8bit": "bitsandbytes' 8-bit weights",
    "load_in_4bit": "bitsandbytes' 4-bit weights",
    "flash_attention": "the flash-attn kernels",
    "tf32": "TensorFloat-32, a CUDA matmul setting",
}


def gpu_only_problems(spec: JobSpec, lines: Mapping[str, int]) -> list[Problem]:
    """The job's GPU-only keys when its node has no GPU, each with its reason, key and line."""
    if spec.gpu_count > 0:
        return []
    count_key = "num_gpus" if isinstance(spec.section, LocalSection) else "gpu_count"
    node = f"this job's node ({spec.provider.value}, {count_key}: 0) has none"
    problems = []
    for key, needs in GPU_ONLY.items():
        if _value(spec, key) is True:
            message = f"{key} needs a CUDA GPU ({needs}); {node}. Ask for a GPU, or remove it"
            problems.append(Problem(key, message, line_of(lines, key)))
    optimizer = _value(spec, "optimizer")
    if optimizer in BNB_OPTIMIZERS:
        message = (
            f"{optimizer} is a bitsandbytes optimizer, which needs a CUDA GPU; {node}. Ask for a GPU, or use "
            "adamw_torch"
        )
        problems.append(Problem("optimizer", message, line_of(lines, "optimizer")))
    return problems


def _value(spec: JobSpec, key: str) -> Any:
    """`key` of the job's training part: a typed field (the builtin's) or a kept one (axolotl's)."""
    train = spec.train
    if key in type(train).model_fields:
        return getattr(train, key)
    return (train.model_extra or {}).get(key)
