"""bench/gpu_node.py's main run in the node's interpreter (`gpu_node.py --child WORK`): train the tiny
example job in this process and print the RESULT line. Standard library only at import: torch, PyYAML and
the trainer load in the child; bench/gpu_node.py loads this file by its path."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
JOB_YAML = REPO / "configs" / "examples" / "tiny-lora.yml"
RESULT = "@@gpu-node "  # the child's result line
PROVIDER_SECTIONS = ("local", "runpod", "vastai")
MIB = 2**20


def tiny_job(yaml: Any) -> dict[str, Any]:
    """The tiny example job's keys without its provider section (`yaml`: PyYAML, in the child)."""
    raw = yaml.safe_load(JOB_YAML.read_text(encoding="utf-8"))
    for key in PROVIDER_SECTIONS:
        raw.pop(key, None)
    assert isinstance(raw, dict)
    return raw


def child(work: Path, precision: str, max_steps: int | None) -> None:
    """In the node's interpreter: train the tiny job in this process and print the RESULT line."""
    sys.path.insert(0, str(REPO))
    import torch
    import yaml

    from trainer.config import TrainConfig, TrainJob
    from trainer.train import train as train_job

    raw = tiny_job(yaml)
    raw["use_ray"] = False
    if max_steps:
        raw["max_steps"] = max_steps
    cuda = torch.cuda.is_available()
    bf16 = cuda and precision != "fp32" and torch.cuda.is_bf16_supported()
    if precision == "bf16" and not bf16:
        raise SystemExit("gpu_node: --precision bf16, but torch says this device has no bf16")
    raw["bf16"] = bf16  # the recipe's own key (its `auto` would be bf16 on CUDA even for --precision fp32);
    # never an autocast around the recipe (trainer.precision._forward_autocast says why)
    job = TrainJob(
        run_id="gpu-node-bench",
        config=TrainConfig.model_validate(raw),
        work_dir=str(work / "run"),
        output_dir=str(work / "run" / "outputs"),
        cache_dir=str(work / "cache"),
        use_gpu=cuda,
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    started = time.monotonic()
    metrics = dict(train_job(job, JOB_YAML.parent))
    if cuda:
        torch.cuda.synchronize()
    train_s = time.monotonic() - started
    peak = torch.cuda.max_memory_allocated() / MIB if cuda else None
    reserved = torch.cuda.max_memory_reserved() / MIB if cuda else None
    out = {
        "device": "cuda" if cuda else "cpu",
        "bf16": bf16,
        "bf16_via": "the job's bf16 key" if bf16 else None,
        "train_s": round(train_s, 3),
        "peak_gpu_mem_mib": None if peak is None else round(peak, 1),
        "peak_gpu_reserved_mib": None if reserved is None else round(reserved, 1),
        "metrics": metrics,
    }
    print(RESULT + json.dumps(out), flush=True)
