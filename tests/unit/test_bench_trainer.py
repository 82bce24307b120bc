"""bench/trainer.py's pure parts (bench/trainer_figures.py), without training: the FLOPs formula (against
PEFT's own count of a small Llama), the GPU peak table, the timed window, the rotation of the rounds and the
JSON report's shape."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "trainer.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_trainer", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)  # it loads bench/trainer_figures.py and bench/trainer_children.py
    figures: ModuleType = module.figures
    return figures


def test_the_shape_counts_what_peft_and_the_model_hold(bench: ModuleType) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = {
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,  # grouped-query attention: k and v are narrower than q
        "vocab_size": 100,
    }
    model = LlamaForCausalLM(LlamaConfig(**config, tie_word_embeddings=False))
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=targets, task_type="CAUSAL_LM"))
    lora = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)

    shape = bench.shape_of(config, lora_r=4)
    assert (shape.layers, shape.hidden, shape.frozen, shape.lora) == (2, 32, linear, lora)


def test_the_flops_formula(bench: ModuleType) -> None:
    shape = bench.Shape(layers=2, hidden=128, frozen=1000, lora=10)
    # 100 tokens in sequences whose squared lengths add up to 2000
    assert shape.flops(100, 2000) == (4 * 1000 + 6 * 10) * 100 + 12 * 2 * 128 * 2000
    assert shape.flops(100, 2000, full=True) == 6 * 1010 * 100 + 12 * 2 * 128 * 2000


def test_the_peak_of_known_gpus_and_none_for_others(bench: ModuleType) -> None:
    assert bench.peak_tflops("NVIDIA H200")[0] == 989.0
    assert bench.peak_tflops("NVIDIA H100 80GB HBM3") == (989.0, "H100 SXM dense bf16 989 TFLOP/s")
    assert bench.peak_tflops("NVIDIA H100 PCIe")[0] == 756.0
    assert bench.peak_tflops("NVIDIA A100-SXM4-80GB")[0] == 312.0
    assert bench.peak_tflops("NVIDIA L40S")[0] == 362.0
    peak, why = bench.peak_tflops("Tesla T4")
    assert peak is None and "'Tesla T4'" in why
    assert bench.peak_tflops(None)[0] is None


def test_the_timed_window_leaves_out_the_first_steps(bench: ModuleType) -> None:
    times = [5.0, 6.0, 6.5, 7.5]  # when steps 1..4 ended
    steps = [[10, 12, 50], [20, 24, 200], [30, 30, 300], [40, 48, 400]]  # [tokens, padded, sum n^2]
    window = bench.timed_window(times, steps, skip=1)
    assert window == bench.Window(tokens=90, padded=102, squares=900, seconds=2.5)
    with pytest.raises(ValueError):
        bench.timed_window(times[:2], steps, skip=1)


def test_rounds_rotate_the_order(bench: ModuleType) -> None:
    names = ["builtin", "hf_trainer", "trl_sft"]
    assert [bench.order(r, names)[0] for r in range(4)] == ["builtin", "hf_trainer", "trl_sft", "builtin"]


def run(times: list[float], loss: float = 3.0, peak: float = 500.0) -> dict[str, Any]:
    """One child's result, as the bench reads it."""
    return {
        "step_times": times,
        "eval_loss": loss,
        "eval_loss_first": 7.0,
        "peak_mem_mib": peak,
        "wall_s": 9.0,
    }


def test_the_report_on_a_gpu(bench: ModuleType) -> None:
    plan = bench.Plan.default(cuda=True, overrides={"steps": 3, "skip": 1, "rounds": 2})
    prep = {
        "plan": dict(vars(plan)),
        "shape": {"layers": 2, "hidden": 8, "frozen": 10**9, "lora": 0},
        "steps": [[1000, 1200, 0]] * 3,
        "model_path": "/m",
        "train_examples": 768,
        "eval_examples": 32,
        "gpu": "NVIDIA H200",
        "versions": {"torch": "2"},
    }
    runs = {  # after step 1, builtin: 2000 tokens in 1 s, then in 2 s; the Trainer: in 2 s, then 2 s
        "builtin": [run([1.0, 1.5, 2.0]), run([1.0, 2.0, 3.0])],
        "hf_trainer": [run([1.0, 2.0, 3.0], loss=3.03), run([1.0, 2.0, 3.0])],
    }
    report = bench.report(prep, runs, {"trl_sft": "trl is not installed here"})
    json.dumps(report)  # one JSON object
    assert report["ok"] is False and report["trainers"]["trl_sft"] == {
        "ok": False,
        "error": "trl is not installed here",
    }
    builtin = report["trainers"]["builtin"]
    assert builtin["tokens_per_s_rounds"] == [2000.0, 1000.0] and builtin["tokens_per_s"] == 1500.0
    assert builtin["model_tflops"] == 6.0  # 4 * 1e9 FLOPs per token * 1500 tokens/s
    assert builtin["mfu"] == round(6.0 / 989, 4) and builtin["mfu_6n"] == round(9.0 / 989, 4)
    assert report["ratios"]["builtin/hf_trainer"] == 1.5  # median of the rounds' 2.0 and 1.0
    assert report["ratios"]["builtin/trl_sft"] is None
    assert report["peak"] == "H200 dense bf16 989 TFLOP/s" and report["precision"] == "bf16"
    assert report["goals"] == {
        "builtin_ge_trainer": True,
        "equal_loss": True,  # 3.0 against the Trainer's median 3.015: within 2%
        "equal_loss_tolerance": 0.02,
        "mfu_ge_35pct": False,
    }


def test_the_report_on_a_cpu_has_no_mfu(bench: ModuleType) -> None:
    plan = bench.Plan.default(cuda=False, overrides={})
    assert (plan.size, plan.bf16, plan.micro) == ("tiny", False, 8)
    prep = {
        "plan": dict(vars(plan)),
        "shape": {"layers": 2, "hidden": 8, "frozen": 100, "lora": 1},
        "steps": [[10, 10, 0]] * plan.steps,
        "model_path": "/m",
        "train_examples": 768,
        "eval_examples": 32,
        "gpu": None,
        "versions": {},
    }
    times = [float(i) for i in range(plan.steps)]
    report = bench.report(prep, {"builtin": [run(times)], "hf_trainer": [{"error": "boom"}]}, {})
    assert report["trainers"]["builtin"]["mfu"] is None and report["peak_tflops"] is None
    assert report["trainers"]["hf_trainer"] == {"ok": False, "error": "boom"}
    assert report["goals"]["builtin_ge_trainer"] is None and report["goals"]["equal_loss"] is None
    with pytest.raises(ValueError, match="--skip"):
        bench.Plan.default(cuda=False, overrides={"skip": 80})
