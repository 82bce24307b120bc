"""bench/trainer.py's plan and figures, without training (no torch): the Plan every trainer trains with,
the FLOPs formula (Shape), the GPU peak table, the timed window, the rotation of the rounds, and the report
made of the children's results (per trainer, the ratios, the goals). Imported as bench.trainer_figures by
bench/trainer.py and bench/trainer_children.py."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "configs" / "examples" / "data" / "tiny-alpaca.jsonl"
EQUAL_LOSS = 0.02  # eval losses within 2% of each other count as equal
# Peak dense bf16 tensor FLOP/s (no sparsity), by a part of torch's device name; the first match wins.
PEAK_BF16_TFLOPS = (
    ("H200", 989.0, "H200 dense bf16"),
    ("H100 PCIe", 756.0, "H100 PCIe dense bf16"),
    ("H100", 989.0, "H100 SXM dense bf16"),
    ("A100", 312.0, "A100 dense bf16"),
    ("L40S", 362.0, "L40S dense bf16"),
)


@dataclass(frozen=True)
class Plan:
    """What every trainer trains with; the children get it as JSON."""

    size: str
    cuda: bool
    bf16: bool
    steps: int
    skip: int  # steps left out of the timing at the start
    micro: int
    gas: int
    seq_len: int
    lr: float
    optimizer: str
    rounds: int
    warmup: int = 5
    scheduler: str = "cosine"
    eval_count: int = 32
    seed: int = 42
    lora_r: int = 8
    lora_alpha: float = 16.0

    @classmethod
    def default(cls, cuda: bool, overrides: dict[str, Any]) -> Plan:
        """The CPU or the GPU plan (see the module docstring), with the command line's values over it."""
        if cuda:
            plan = cls("small", True, True, 100, 10, 256, 1, 256, 2e-3, "adamw_torch_fused", 2)
        else:
            plan = cls("tiny", False, False, 60, 10, 8, 1, 128, 1e-2, "adamw_torch", 2)
        plan = replace(plan, **{k: v for k, v in overrides.items() if v is not None})
        if plan.skip < 1 or plan.skip >= plan.steps:
            raise ValueError(f"--skip {plan.skip}: must be at least 1 and below --steps {plan.steps}")
        return plan


@dataclass(frozen=True)
class Shape:
    """What the FLOPs formula needs of a Llama-shaped model with LoRA on every linear layer."""

    layers: int
    hidden: int
    frozen: int  # weights of the linear layers and the output head (frozen under LoRA)
    lora: int  # LoRA's A and B of every adapted linear layer

    def flops(self, tokens: float, squares: float, full: bool = False) -> float:
        """Model FLOPs of training on sequences with `tokens` real tokens in all and Σn² = `squares`:
        (4·N_frozen + 6·N_lora)·tokens + 12·L·d·Σn²; `full`: 6·(N_frozen + N_lora)·tokens + 12·L·d·Σn²."""
        per_token = 6 * (self.frozen + self.lora) if full else 4 * self.frozen + 6 * self.lora
        return per_token * tokens + 12 * self.layers * self.hidden * squares


def shape_of(config: dict[str, Any], lora_r: int) -> Shape:
    """The Shape of a Llama config.json (q, k, v, o, gate, up, down per layer, plus the head) with LoRA
    rank `lora_r` on every linear layer but the head (`lora_target_linear`)."""
    d, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or d // heads)
    inter, vocab = int(config["intermediate_size"]), int(config["vocab_size"])
    q, k = heads * head_dim, kv * head_dim
    linears = [(d, q), (d, k), (d, k), (q, d), (d, inter), (d, inter), (inter, d)]  # (in, out)
    frozen = layers * sum(i * o for i, o in linears) + vocab * d
    lora = layers * sum(lora_r * (i + o) for i, o in linears)
    return Shape(layers=layers, hidden=d, frozen=frozen, lora=lora)


def peak_tflops(gpu: str | None) -> tuple[float | None, str]:
    """The GPU's peak dense bf16 TFLOP/s and what it is; None and why for an unknown GPU or none."""
    if not gpu:
        return None, "no GPU: MFU is a GPU figure"
    for part, peak, what in PEAK_BF16_TFLOPS:
        if part.lower() in gpu.lower():
            return peak, f"{what} {peak:g} TFLOP/s"
    return (
        None,
        f"no peak bf16 FLOP/s known for {gpu!r} (known: {', '.join(p for p, _, _ in PEAK_BF16_TFLOPS)})",
    )


@dataclass(frozen=True)
class Window:
    """The timed steps of one run: real and padded tokens, Σn², seconds."""

    tokens: int
    padded: int
    squares: int
    seconds: float


def timed_window(times: list[float], steps: list[list[int]], skip: int) -> Window:
    """Steps skip+1 .. last: `times[i]` is when step i+1 ended, `steps[i]` its [tokens, padded, Σn²]."""
    if len(times) != len(steps) or len(times) <= skip:
        raise ValueError(f"{len(times)} step times for {len(steps)} steps, {skip} of them skipped")
    rest = steps[skip:]
    return Window(
        tokens=sum(s[0] for s in rest),
        padded=sum(s[1] for s in rest),
        squares=sum(s[2] for s in rest),
        seconds=times[-1] - times[skip - 1],
    )


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a and b else None


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def order(round_index: int, names: list[str]) -> list[str]:
    """Round r runs the trainers rotated by r: ABC, BCA, CAB, ..."""
    cut = round_index % len(names)
    return names[cut:] + names[:cut]


def summarize(name: str, runs: list[dict[str, Any]], prep: dict[str, Any]) -> dict[str, Any]:
    """One trainer's figures over its rounds (medians), from its children's results."""
    failed = [r["error"] for r in runs if "error" in r]
    if failed:
        return {"ok": False, "error": failed[0]}
    plan, shape = prep["plan"], Shape(**prep["shape"])
    windows = [timed_window(r["step_times"], prep["steps"], plan["skip"]) for r in runs]
    rates = [w.tokens / w.seconds for w in windows]
    out: dict[str, Any] = {
        "ok": True,
        "tokens_per_s": round(median(rates) or 0.0, 1),
        "tokens_per_s_rounds": [round(r, 1) for r in rates],
        "padded_tokens_per_s": round(median([w.padded / w.seconds for w in windows]) or 0.0, 1),
        "peak_mem_mib": round(median([r["peak_mem_mib"] for r in runs]) or 0.0, 1),
        "eval_loss": round(median([r["eval_loss"] for r in runs]) or 0.0, 5),
        "eval_loss_first": round(runs[0]["eval_loss_first"], 5),
        "wall_s": round(median([r["wall_s"] for r in runs]) or 0.0, 2),
        "notes": runs[0].get("notes", []),
    }
    flops = [shape.flops(w.tokens, w.squares) / w.seconds for w in windows]
    flops_6n = [shape.flops(w.tokens, w.squares, full=True) / w.seconds for w in windows]
    out["model_tflops"] = round((median(flops) or 0.0) / 1e12, 4)
    peak, _ = peak_tflops(prep.get("gpu"))
    out["mfu"] = round((median(flops) or 0.0) / (peak * 1e12), 4) if peak else None
    out["mfu_6n"] = round((median(flops_6n) or 0.0) / (peak * 1e12), 4) if peak else None
    if "trainable_params" in runs[0]:
        out["trainable_params"] = runs[0]["trainable_params"]
    return out


def paired_ratio(runs: dict[str, list[dict[str, Any]]], prep: dict[str, Any], other: str) -> float | None:
    """The median over rounds of builtin's tokens/s over `other`'s in the same round."""
    skip, steps = prep["plan"]["skip"], prep["steps"]
    found = []
    for mine, theirs in zip(runs.get("builtin", []), runs.get(other, []), strict=False):
        if "error" in mine or "error" in theirs:
            continue
        a, b = (timed_window(r["step_times"], steps, skip) for r in (mine, theirs))
        found.append((a.tokens / a.seconds) / (b.tokens / b.seconds))
    value = median(found)
    return round(value, 4) if value is not None else None


def goals(report: dict[str, Any]) -> dict[str, Any]:
    """Issue 20's goals, read off the report: builtin ≥ 1.0x Trainer at equal loss, MFU ≥ 35%."""
    mine, theirs = report["trainers"].get("builtin", {}), report["trainers"].get("hf_trainer", {})
    equal = None
    if mine.get("ok") and theirs.get("ok"):
        equal = abs(mine["eval_loss"] - theirs["eval_loss"]) <= EQUAL_LOSS * theirs["eval_loss"]
    r = report["ratios"].get("builtin/hf_trainer")
    mfu = mine.get("mfu")
    return {
        "builtin_ge_trainer": None if r is None else r >= 1.0,
        "equal_loss": equal,
        "equal_loss_tolerance": EQUAL_LOSS,
        "mfu_ge_35pct": None if mfu is None else mfu >= 0.35,
    }


def report(
    prep: dict[str, Any], runs: dict[str, list[dict[str, Any]]], skipped: dict[str, str]
) -> dict[str, Any]:
    """The JSON object: the plan, each trainer's figures, the ratios and the goals."""
    plan, shape = prep["plan"], prep["shape"]
    peak, peak_what = peak_tflops(prep.get("gpu"))
    trainers = {name: summarize(name, found, prep) for name, found in runs.items()}
    trainers.update({name: {"ok": False, "error": why} for name, why in skipped.items()})
    out: dict[str, Any] = {
        "bench": "trainer",
        "ok": all(t["ok"] for t in trainers.values()),
        "device": "cuda" if plan["cuda"] else "cpu",
        "gpu": prep.get("gpu"),
        "precision": "bf16" if plan["bf16"] else "fp32",
        "peak_tflops": peak,
        "peak": peak_what,
        "model": {"size": plan["size"], "path": prep["model_path"], **shape},
        "plan": plan,
        "data": {
            "file": str(DATA.relative_to(REPO)),
            "train_examples": prep["train_examples"],
            "eval_examples": prep["eval_examples"],
            "timed_steps": f"{plan['skip'] + 1}-{plan['steps']}",
            "tokens": "non-padding tokens (prompt and completion) of the timed steps",
        },
        "flops_formula": "per sequence of n real tokens: (4*N_frozen + 6*N_lora)*n + 12*L*d*n^2 "
        "(mfu_6n: 6*(N_frozen + N_lora)*n + 12*L*d*n^2)",
        "trainers": trainers,
        "ratios": {
            "builtin/hf_trainer": paired_ratio(runs, prep, "hf_trainer"),
            "builtin/trl_sft": paired_ratio(runs, prep, "trl_sft"),
            "how": "tokens/s, the median over rounds of each round's own ratio",
        },
        "versions": prep["versions"],
    }
    out["goals"] = goals(out)
    return out
