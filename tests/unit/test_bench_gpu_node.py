"""bench/gpu_node.py's own logic, without torch or a GPU: what it reads from the repository, how it reads
the readiness check, how it measures steps/s, and that a run without CUDA is never `ok`."""

from __future__ import annotations

import importlib.util
import stat
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_node.py"


@pytest.fixture(scope="module")
def gpu_node() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gpu_node", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_python(folder: Path, stdout: str, stderr: str = "", code: int = 0) -> str:
    """An executable that answers any command line with `stdout`, `stderr` and exit `code`."""
    (folder / "out.txt").write_text(stdout)
    (folder / "err.txt").write_text(stderr)
    path = folder / "python"
    path.write_text(f"#!/bin/sh\ncat '{folder}/out.txt'\ncat '{folder}/err.txt' >&2\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_reads_the_node_requirements_and_the_fleet_python(gpu_node: ModuleType) -> None:
    reqs = gpu_node.requirements()
    assert reqs["ray"] == "==2.60.*"
    assert {"torch", "transformers", "peft", "pyyaml"} <= set(reqs)
    assert gpu_node.fleet_python() == "3.11"


def test_steps_per_second_leaves_out_intervals_with_an_eval(gpu_node: ModuleType) -> None:
    timed = [
        (0.0, {"kind": "eval", "step": 0}),
        (1.0, {"kind": "step", "step": 5}),
        (2.0, {"kind": "step", "step": 10}),  # 5 steps in 1 s
        (2.5, {"kind": "eval", "step": 10}),
        (9.0, {"kind": "step", "step": 15}),  # after an eval: left out
        (10.0, {"kind": "step", "step": 20}),  # 5 steps in 1 s
    ]
    assert gpu_node.throughput(timed) == 5.0
    assert gpu_node.throughput(timed[:2]) is None


def test_progress_lines_are_found_behind_a_prefix(gpu_node: ModuleType) -> None:
    text = 'noise\n(worker) @@fleet {"kind":"step","step":5}\n@@fleet not json\n'
    assert gpu_node.progress_records(text) == [{"kind": "step", "step": 5}]


def test_the_readiness_check_read_back(gpu_node: ModuleType, tmp_path: Path) -> None:
    line = '@@fleet {"kind":"checked","problems":["asked for 1 GPU, CUDA sees 0"],"cuda":false,"gpus":0}\n'
    found = gpu_node.readiness(fake_python(tmp_path, line), 1, "2.60.0")
    assert found["status"] == "problems" and found["problems"] == ["asked for 1 GPU, CUDA sees 0"]
    clean = line.replace('["asked for 1 GPU, CUDA sees 0"]', "[]")
    assert gpu_node.readiness(fake_python(tmp_path, clean), 1, None)["status"] == "ok"
    old = "python -m trainer: error: argument command: invalid choice: 'check'"
    assert gpu_node.readiness(fake_python(tmp_path, "", old, 2), 1, None)["status"] == "absent"
    assert gpu_node.readiness(fake_python(tmp_path, "", "Traceback ...", 1), 1, None)["status"] == "failed"


def start(cuda: bool | None, check: str = "ok", error: str | None = None) -> dict[str, Any]:
    trained = None if error else True
    return {"cuda": cuda, "check": {"status": check}, "error": error, "trained": trained}


def run(first: float = 7.8, last: float = 3.1) -> dict[str, Any]:
    metrics = {"eval_loss_first": first, "eval_loss": last, "global_step": 180}
    return {"device": "cuda", "bf16": True, "train_s": 9.0, "steps_per_s": 30.0, "metrics": metrics}


def test_ok_only_on_cuda_with_a_clean_check_and_a_falling_loss(gpu_node: ModuleType) -> None:
    result = start(cuda=True)
    assert gpu_node.verdict(result, run()) == 0
    assert result["ok"] is True and result["why_not"] == [] and result["steps_per_s_overall"] == 20.0

    result = start(cuda=True, check="problems")
    assert gpu_node.verdict(result, run()) == 1 and result["ok"] is False

    result = start(cuda=True)
    assert gpu_node.verdict(result, run(last=9.0)) == 1 and result["why_not"] == [
        "the eval loss did not fall"
    ]


def test_a_cpu_run_never_passes(gpu_node: ModuleType) -> None:
    refused = start(cuda=False, check="problems", error="no CUDA: torch sees no GPU; refusing to train")
    assert gpu_node.verdict(refused, None) == 2
    assert refused["ok"] is False and refused["trained"] is None

    allowed = start(cuda=False, check="problems")  # --allow-cpu: finished, exit 0, but not ok
    assert gpu_node.verdict(allowed, run()) == 0
    assert allowed["ok"] is False and "no CUDA" in allowed["why_not"]
