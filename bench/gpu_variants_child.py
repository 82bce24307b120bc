"""bench/gpu_variants.py's child side, in the node's interpreter (`gpu_node.py --child WORK --variant X`):
train one variant of the tiny job and print its RESULT line; for (e), the crash after the halfway
checkpoint, the restore, and the restored optimizer state compared with the saved one. Standard library only
at import: torch and the trainer load in the child; bench/gpu_node.py imports it as a module."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from bench import gpu_variants

REPO = Path(__file__).resolve().parents[1]
MIB = 2**20


def child(work: Path, letter: str, steps: int, raw: dict[str, Any], base_dir: Path) -> int:
    """In the node's interpreter: train variant `letter` of the tiny job (`raw`, its datasets relative to
    `base_dir`) and print the RESULT line; exit 1 when it raised (the error is in the line)."""
    sys.path.insert(0, str(REPO))
    import torch

    from trainer.config import TrainConfig, TrainJob
    from trainer.train import train as train_job

    variant = gpu_variants.VARIANTS[letter]
    cuda = torch.cuda.is_available()
    out: dict[str, Any] = {
        "device": "cuda" if cuda else "cpu",
        "error": None,
        "metrics": None,
        "resume": None,
    }
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    try:
        run = work / f"variant-{letter}"
        job = TrainJob(
            run_id=f"gpu-variant-{letter}",
            config=TrainConfig.model_validate(gpu_variants.variant_config(raw, variant, steps)),
            work_dir=str(run),
            output_dir=str(run / "outputs"),
            cache_dir=str(work / "cache"),  # the main run's: the tiny model is built once
            use_gpu=cuda,
        )
        if variant.resume:
            out["resume"] = crash_and_restore(job, base_dir)
        out["metrics"] = dict(train_job(job, base_dir))
    except Exception as exc:  # noqa: BLE001 - the error is the variant's result
        message = " | ".join(str(exc).strip().splitlines()[:3])[:500]
        out["error"] = f"{type(exc).__name__}: {message}"
    if cuda:
        out["peak_gpu_mem_mib"] = round(torch.cuda.max_memory_allocated() / MIB, 1)
    print(gpu_variants.RESULT + json.dumps(out, default=str), flush=True)
    return 1 if out["error"] else 0


def crash_and_restore(job: Any, base_dir: Path) -> dict[str, Any]:
    """(e) before its resume: train until the crash injected after the halfway checkpoint, then build the
    run again (RunSetup finds the checkpoint and restores it) and compare its optimizer state with the
    checkpoint's optimizer.pt."""
    import torch

    from trainer import outputs, snapshot
    from trainer.faults import ENV_VAR, InjectedCrash
    from trainer.recipe_setup import RunSetup
    from trainer.tiny import resolve_model
    from trainer.train import cache_dir
    from trainer.train import train as train_job

    half = job.config.save_steps
    os.environ[ENV_VAR] = f"crash_after_step:{half}"
    try:
        train_job(job, base_dir)
        raise RuntimeError(f"the crash injected after step {half} did not happen")
    except InjectedCrash:
        pass
    finally:
        del os.environ[ENV_VAR]
    checkpoint = outputs.latest_checkpoint(Path(job.work_dir) / outputs.CHECKPOINTS_DIR)
    if checkpoint is None:
        raise RuntimeError(f"no complete checkpoint under {job.work_dir} after the crash")
    saved = outputs.load_checkpoint(checkpoint).optimizer
    setup = RunSetup(job, resolve_model(job.config.base_model, cache_dir(job)), base_dir, under_ray=False)
    restored = snapshot.cpu_copy(setup.optimizer.state_dict())
    states = [v for state in setup.optimizer.state.values() for v in state.values()]
    params = [p for group in setup.optimizer.param_groups for p in group["params"]]
    tensors = list(flat_tensors(saved))
    report = {
        "crashed_at": half,
        "checkpoint": checkpoint.name,
        "optimizer": type(setup.optimizer).__name__,
        "state_tensors": len(tensors),
        "uint8_state_tensors": sum(1 for t in tensors if t.dtype == torch.uint8),
        "differences": differences(saved, restored)[:5],
        "pageable_params": sum(1 for p in params if p.numel() >= gpu_variants.PAGED_MIN),
        "paged_state_after_restore": sum(1 for v in states if getattr(v, "is_paged", False)),
    }
    del setup
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return report


def flat_tensors(obj: Any) -> Any:
    """Every tensor in a nested state dict (anything with `dtype` and `shape`)."""
    if hasattr(obj, "dtype") and hasattr(obj, "shape"):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from flat_tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from flat_tensors(value)


def differences(saved: Any, restored: Any, path: str = "") -> list[str]:
    """Where two state dicts differ (structure, dtype, shape, values), as key paths; [] when equal."""
    if hasattr(saved, "dtype") and hasattr(saved, "shape"):
        import torch

        same = (
            hasattr(restored, "dtype")
            and saved.dtype == restored.dtype
            and saved.shape == restored.shape
            and torch.equal(saved.cpu(), restored.cpu())
        )
        return [] if same else [f"{path or '.'}: tensor differs"]
    if isinstance(saved, dict) and isinstance(restored, dict):
        if set(saved) != set(restored):
            return [f"{path or '.'}: keys {sorted(map(str, saved))} != {sorted(map(str, restored))}"]
        return [d for k in saved for d in differences(saved[k], restored[k], f"{path}/{k}")]
    if isinstance(saved, (list, tuple)) and isinstance(restored, (list, tuple)):
        if len(saved) != len(restored):
            return [f"{path or '.'}: {len(saved)} items != {len(restored)}"]
        return [
            d
            for i, (x, y) in enumerate(zip(saved, restored, strict=True))
            for d in differences(x, y, f"{path}/{i}")
        ]
    return [] if saved == restored else [f"{path or '.'}: {saved!r} != {restored!r}"]
