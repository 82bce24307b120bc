"""The builtin recipe against transformers' Trainer and TRL's SFTTrainer: same model, data, steps; tokens/s.

    .venv/bin/python bench/trainer.py [--rounds N] [--steps N] [--micro-batch N] [--size tiny|small] [--cpu]
                                      [--only builtin,hf_trainer,trl_sft]

Three trainers train one LoRA adapter on the same base model, the same tokens and the same schedule:
(a) `builtin`: trainer.recipe.run in one process (`use_ray: false`), timed at its STEP progress lines;
(b) `hf_trainer`: transformers' Trainer on a PEFT model; (c) `trl_sft`: TRL's SFTTrainer on the same PEFT
model. Each run is its own child process (fresh memory, its own peak), and the rounds interleave the
trainers (ABC, BCA, CAB, ...) so that a noisy machine slows all of them alike. Ratios are the median of
each round's own builtin/other ratio.

Sameness. The data is the tiny example's alpaca file, tokenized once by trainer.data.prepare (so the tokens
and the prompt masking are the recipe's own), 32 examples held out for eval, 768 to train. The training
order is the recipe's (its DistributedSampler, seeded): the other two get those examples in that order with
a sequential sampler. The LoRA targets come from trainer.lora.lora_targets; r 8, alpha 16, dropout 0 (no
dropout: the three runs are then the same computation, and their losses agree closely); AdamW (torch's,
fused on a GPU), cosine schedule with 5 warm-up steps, gradient clipping at 1.0, no gradient checkpointing
(TRL's default is on: turned off), no evaluation while training. Every model is seeded the same before the
adapter is made, so the adapters start equal.

Figures. tokens/s counts the training tokens that are not padding, over the steps after the first
`--skip` (loading, allocation and kernel warm-up left out), from the end of step `skip` to the end of the
last step (a CUDA sync at each step's end). Peak memory: CUDA max_memory_allocated on a GPU, the peak RSS of
the child on a CPU (imports included). Eval loss: token-weighted mean cross-entropy over the eval set's
trained tokens (sum over tokens / number of tokens), the recipe's own definition, computed the same way
for the other two after training. wall_s: the child process from start to exit.

FLOPs and MFU (on a GPU). Model FLOPs of a training step count the useful work of LoRA training, per
sequence of n real tokens (padding not counted): (4·N_frozen + 6·N_lora)·n + 12·L·d·n². The frozen weights
N_frozen (every linear layer, the output head included; the embedding lookup does no multiply-adds) cost a
forward pass and the input gradients (2 + 2 FLOPs per weight per token) but no weight gradient, which the
usual 6·N counts; the LoRA weights N_lora cost all three. 12·L·d·n² is attention's QK^T and AV forward and
backward (L layers, hidden d, the full nxn square as PaLM's MFU counts it). `mfu_6n` also gives the
full-fine-tune convention 6·(N_frozen + N_lora)·n + 12·L·d·n² for comparison (it overstates LoRA's work by
about 1.5x). MFU = model FLOPs/s ÷ the GPU's peak dense bf16 FLOPs (PEAK_BF16_TFLOPS; a GPU not listed gets
MFU null with the reason). The goal (issue 20): builtin ≥ 1.0x hf_trainer's tokens/s at equal eval loss,
and `mfu` ≥ 35% on an H100/H200.

Sizes. CPU: the tiny model (trainer.tiny.TINY_SPEC), fp32, micro batch 8, 60 steps, 2 rounds (about a
minute on two quiet cores, several when others load them). CUDA: trainer.tiny.SMALL_SPEC (~116M parameters,
built here: nothing is downloaded), bf16 (the recipe gets `bf16: true`, `tf32: true`, `sdp_attention:
true` where its TrainConfig has those keys, else it runs under an outer bf16 autocast and says so), micro
batch 256, 100 steps, 2 rounds.

The last line printed is one JSON object with all of it. Exit status: 0 when every trainer asked for ran
(goals met or not), 1 when one failed, 2 when the setup failed. A benchmark: it never gates CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# Run as a script, this file's folder comes first on sys.path, and `import trainer` would find this file:
# the repository's trainer package is meant.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DATA = REPO / "configs" / "examples" / "data" / "tiny-alpaca.jsonl"
CACHE = REPO / "out" / "bench-models"
RESULT = "@@bench-trainer "  # a child's result line
MARKER = "@@fleet "  # trainer.progress.MARKER
TRAINERS = ("builtin", "hf_trainer", "trl_sft")
MIB = 2**20
EQUAL_LOSS = 0.02  # eval losses within 2% of each other count as equal
# Peak dense bf16 tensor FLOP/s (no sparsity), by a part of torch's device name; the first match wins.
PEAK_BF16_TFLOPS = (
    ("H200", 989.0, "H200 dense bf16"),
    ("H100 PCIe", 756.0, "H100 PCIe dense bf16"),
    ("H100", 989.0, "H100 SXM dense bf16"),
    ("A100", 312.0, "A100 dense bf16"),
    ("L40S", 362.0, "L40S dense bf16"),
)
BF16_KEYS = ("bf16", "tf32", "sdp_attention")  # the recipe's precision keys (issue 20, P1)


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


# ---------------------------------------------------------------------------------------------- the parent


def child_env() -> dict[str, str]:
    """The children's environment: the repository importable (in front of any PYTHONPATH already set, such
    as carried wheels), nothing of the fleet's, no network for the hub, W&B or datasets."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "RAY_"))}
    path = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(PYTHONPATH=path, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_MODE="disabled")
    env.update(TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", HF_DATASETS_DISABLE_PROGRESS_BARS="1")
    return env


def run_child(kind: str, payload: dict[str, Any], work: Path, timeout: float) -> dict[str, Any]:
    """Run this file as `--child kind` with `payload`; its RESULT line, with `wall_s`, or {"error": ...}."""
    work.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--payload", json.dumps(payload)]
    log = work / f"{kind}.log"
    started = time.monotonic()
    try:
        done = subprocess.run(
            argv, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        log.write_text(str(exc.stdout or "") + str(exc.stderr or ""))
        return {"error": f"{kind}: timed out after {timeout:g} s (log: {log})"}
    wall = time.monotonic() - started
    log.write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    found = [ln for ln in done.stdout.splitlines() if ln.startswith(RESULT)]
    if done.returncode != 0 or not found:
        lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
        return {"error": f"{kind}: exit {done.returncode}: {' | '.join(lines[-3:])} (log: {log})"}
    result: dict[str, Any] = json.loads(found[-1][len(RESULT) :])
    result["wall_s"] = round(wall, 2)
    return result


def say(text: str) -> None:
    print(f"bench.trainer: {text}", flush=True)


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


def show(result: dict[str, Any]) -> None:
    """The human-readable table before the JSON line."""
    say(f"{'trainer':<11} {'tokens/s':>10} {'peak MiB':>9} {'eval loss':>9} {'wall s':>7} {'MFU':>6}")
    for name, t in result["trainers"].items():
        if not t["ok"]:
            say(f"{name:<11} not run: {t['error']}")
            continue
        mfu = "-" if t["mfu"] is None else f"{100 * t['mfu']:.1f}%"
        say(
            f"{name:<11} {t['tokens_per_s']:>10.1f} {t['peak_mem_mib']:>9.1f} {t['eval_loss']:>9.4f} "
            f"{t['wall_s']:>7.1f} {mfu:>6}"
        )
    ratios = ", ".join(f"{k} {v}x" for k, v in result["ratios"].items() if k != "how")
    say(f"ratios (tokens/s): {ratios}; peak: {result['peak']}; goals: {result['goals']}")


def measure(args: argparse.Namespace, work: Path) -> tuple[dict[str, Any], int]:
    """Prepare (build the model, plan, count the tokens), then the rounds; the report and exit status."""
    overrides = {"size": args.size, "steps": args.steps, "skip": args.skip, "micro": args.micro_batch}
    overrides["rounds"] = args.rounds
    payload = {"overrides": overrides, "cpu": args.cpu, "cache": str(args.cache_dir)}
    prep = run_child("prepare", payload, work, args.timeout)
    if "error" in prep:
        return {"bench": "trainer", "ok": False, "error": prep["error"]}, 2
    plan = prep["plan"]
    say(
        f"{'cuda ' + str(prep['gpu']) if plan['cuda'] else 'cpu'}, {plan['size']} model "
        f"({prep['shape']['frozen'] / 1e6:.2f}M linear weights), {'bf16' if plan['bf16'] else 'fp32'}, "
        f"micro batch {plan['micro']} x {plan['gas']}, {plan['steps']} steps (timed after {plan['skip']}), "
        f"{plan['rounds']} rounds"
    )
    names = [n for n in TRAINERS if n in args.only.split(",")]
    skipped = {n: prep["missing"][n] for n in names if n in prep["missing"]}
    names = [n for n in names if n not in skipped]
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(plan["rounds"]):
        for name in order(r, names):
            where = work / f"{name}-{r + 1}"
            job = {"plan": plan, "model_path": prep["model_path"], "work": str(where)}
            got = run_child(name, job, where, args.timeout)
            runs[name].append(got)
            if "error" in got:
                say(f"round {r + 1} {name}: FAILED: {got['error']}")
                continue
            window = timed_window(got["step_times"], prep["steps"], plan["skip"])
            say(
                f"round {r + 1} {name}: {window.tokens / window.seconds:.1f} tokens/s, peak "
                f"{got['peak_mem_mib']:.1f} MiB, eval loss {got['eval_loss']:.4f} ({got['wall_s']} s)"
            )
    result = report(prep, runs, {k: v for k, v in skipped.items()})
    result["error"] = None
    return result, 0 if result["ok"] else 1


# ------------------------------------------------------------------------------------------ the children


def train_config(plan: Plan, model_path: Path, keys: list[str]) -> Any:
    """The recipe's TrainConfig for `plan` (the one source of every hyperparameter, for all three trainers);
    `keys`: the recipe's precision keys it has (bf16 as planned; tf32 and sdp_attention on a GPU)."""
    from trainer.config import TrainConfig

    raw: dict[str, Any] = {
        "base_model": str(model_path),
        "datasets": [{"path": str(DATA), "type": "alpaca"}],
        "adapter": "lora",
        "lora_r": plan.lora_r,
        "lora_alpha": plan.lora_alpha,
        "lora_dropout": 0.0,
        "lora_target_linear": True,
        "sequence_len": plan.seq_len,
        "micro_batch_size": plan.micro,
        "gradient_accumulation_steps": plan.gas,
        "max_steps": plan.steps,
        "learning_rate": plan.lr,
        "lr_scheduler": plan.scheduler,
        "warmup_steps": plan.warmup,
        "optimizer": plan.optimizer,
        "val_set_size": plan.eval_count,
        "logging_steps": 1,
        "eval_table_size": 0,
        "seed": plan.seed,
        "use_ray": False,
    }
    if "bf16" in keys:
        raw["bf16"] = plan.bf16  # not the recipe's `auto`: the plan decides
    if plan.cuda:
        raw.update({key: True for key in ("tf32", "sdp_attention") if key in keys})
    return TrainConfig.model_validate(raw)


def schedule(n_train: int, plan: Plan) -> list[list[list[int]]]:
    """The recipe's training order: per optimizer step, its micro batches of example indices (the recipe's
    seeded DistributedSampler, epoch after epoch). Epochs must split into whole steps, so that a sequential
    sampler over the concatenation gives the other trainers the very same batches."""
    from torch.utils.data import DistributedSampler

    if n_train % plan.micro or (n_train // plan.micro) % plan.gas:
        raise ValueError(
            f"{n_train} training examples do not split into whole steps of {plan.micro} x {plan.gas}: pick a "
            "micro batch and accumulation that divide it"
        )
    sampler = DistributedSampler(range(n_train), num_replicas=1, rank=0, shuffle=True, seed=plan.seed)
    steps: list[list[list[int]]] = []
    epoch = 0
    while len(steps) < plan.steps:
        sampler.set_epoch(epoch)
        indices = list(sampler)
        batches = [indices[i : i + plan.micro] for i in range(0, n_train, plan.micro)]
        steps += [batches[i : i + plan.gas] for i in range(0, len(batches), plan.gas)]
        epoch += 1
    return steps[: plan.steps]


def step_stats(lengths: list[int], steps: list[list[list[int]]]) -> list[list[int]]:
    """Per step: [real tokens, padded tokens (each micro batch padded to its longest), Σn²]."""
    found = []
    for step in steps:
        tokens = padded = squares = 0
        for batch in step:
            sizes = [lengths[i] for i in batch]
            tokens += sum(sizes)
            padded += len(sizes) * max(sizes)
            squares += sum(n * n for n in sizes)
        found.append([tokens, padded, squares])
    return found


def prepare_child(payload: dict[str, Any]) -> dict[str, Any]:
    """Decide the plan for this device, build the model, count every step's tokens; what is missing."""
    import importlib.metadata as metadata
    import importlib.util

    import torch
    from transformers import AutoTokenizer

    from trainer.data import prepare
    from trainer.tiny import SIZES, build_tiny

    cuda = torch.cuda.is_available() and not payload["cpu"]
    plan = Plan.default(cuda, payload["overrides"])
    if plan.bf16 and not torch.cuda.is_bf16_supported():
        raise SystemExit("bench.trainer: this GPU has no bf16")
    model = build_tiny(Path(payload["cache"]), SIZES[plan.size])
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    split = prepare(train_config(plan, model, []), tokenizer, REPO)
    steps = step_stats([len(e.input_ids) for e in split.train], schedule(len(split.train), plan))
    missing = {}
    for name in ("trl", "datasets"):
        if importlib.util.find_spec(name) is None:
            missing["trl_sft"] = f"{name} is not installed here (pip install -e '.[bench]')"
    versions = {}
    for name in ("torch", "transformers", "peft", "accelerate", "trl", "datasets"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "plan": asdict(plan),
        "model_path": str(model),
        "shape": asdict(shape_of(config, plan.lora_r)),
        "steps": steps,
        "train_examples": len(split.train),
        "eval_examples": len(split.eval),
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "missing": missing,
        "versions": versions,
    }


class Clock:
    """When each optimizer step ended (seconds from this clock's start), after a CUDA sync on a GPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda, self.start, self.times = cuda, time.perf_counter(), []  # type: list[float]

    def tick(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self.start)


class StepLines:
    """sys.stdout for the recipe: passes everything through and ticks the clock at each STEP line."""

    def __init__(self, out: Any, clock: Clock) -> None:
        self.out, self.clock, self.pending = out, clock, ""

    def write(self, text: str) -> int:
        self.pending += text
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            at = line.find(MARKER)
            if at >= 0 and json.loads(line[at + len(MARKER) :]).get("kind") == "step":
                self.clock.tick()
        return self.out.write(text)  # type: ignore[no-any-return]

    def flush(self) -> None:
        self.out.flush()


def run_builtin(plan: Plan, model: Path, work: Path, clock: Clock) -> dict[str, Any]:
    """trainer.recipe.run in this process, timed at its STEP lines (logging_steps 1)."""
    import torch

    from trainer import recipe
    from trainer.config import TrainConfig, TrainJob

    keys = [k for k in BF16_KEYS if k in TrainConfig.model_fields]
    cfg = train_config(plan, model, keys)
    job = TrainJob(
        run_id="bench-builtin",
        config=cfg,
        work_dir=str(work / "run"),
        output_dir=str(work / "out"),
        cache_dir=str(work / "cache"),
        use_gpu=plan.cuda,
    )
    outer = plan.bf16 and "bf16" not in keys
    notes = []
    if outer:
        notes.append("TrainConfig has no bf16 key: the recipe ran under an outer bf16 autocast, tf32 on")
        torch.backends.cuda.matmul.allow_tf32 = True
    elif keys:
        notes.append("the recipe got " + ", ".join(f"{k}: {str(getattr(cfg, k)).lower()}" for k in keys))
    real, sys.stdout = sys.stdout, StepLines(sys.stdout, clock)  # type: ignore[assignment]
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=outer):
            metrics = recipe.run(job, model, base_dir=REPO)
    finally:
        sys.stdout = real
    return {
        "eval_loss": metrics["eval_loss"],
        "eval_loss_first": metrics["eval_loss_first"],
        "trainable_params": metrics["trainable_params"],
        "notes": notes,
    }


def eval_loss(model: Any, examples: list[Any], plan: Plan, pad_id: int) -> float:
    """Token-weighted mean loss over `examples`, as trainer.recipe evaluates (the same batches, the same
    sum over trained tokens / their number)."""
    import torch

    from trainer.data import IGNORE_INDEX, Collator

    device = torch.device("cuda" if plan.cuda else "cpu")
    collate, total, count = Collator(pad_id), 0.0, 0.0
    model.eval()
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=plan.bf16):
        for at in range(0, len(examples), plan.micro):
            batch = {k: v.to(device) for k, v in collate(examples[at : at + plan.micro]).items()}
            labels = batch.pop("labels")[:, 1:]
            logits = model(**batch).logits[:, :-1].float()
            total += float(
                torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]),
                    labels.reshape(-1),
                    ignore_index=IGNORE_INDEX,
                    reduction="sum",
                )
            )
            count += float((labels != IGNORE_INDEX).sum())
    model.train()
    return total / max(count, 1.0)


def hf_arguments(plan: Plan, work: Path, fields: set[str]) -> dict[str, Any]:
    """TrainingArguments (and SFTConfig's shared part) matching the recipe's settings of `plan`."""
    args: dict[str, Any] = {
        "output_dir": str(work / "hf"),
        "max_steps": plan.steps,
        "per_device_train_batch_size": plan.micro,
        "gradient_accumulation_steps": plan.gas,
        "learning_rate": plan.lr,
        "lr_scheduler_type": plan.scheduler,
        "warmup_steps": plan.warmup,
        "optim": plan.optimizer,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,  # the recipe's MAX_GRAD_NORM
        "logging_steps": plan.steps,
        "save_strategy": "no",
        "eval_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "seed": plan.seed,
        "dataloader_num_workers": 0,
        "bf16": plan.bf16,
        "gradient_checkpointing": False,
        "remove_unused_columns": False,
        "label_names": ["labels"],
        "use_cpu": not plan.cuda,
    }
    if plan.cuda:
        args["tf32"] = True
    if "train_sampling_strategy" in fields:
        args["train_sampling_strategy"] = "sequential"
    return args


def run_hf(plan: Plan, model: Path, work: Path, clock: Clock, trl: bool) -> dict[str, Any]:
    """transformers' Trainer (or TRL's SFTTrainer) on a PEFT model with the recipe's data, order, LoRA
    and hyperparameters, timed by a callback at each step's end."""
    import dataclasses

    import torch
    from peft import LoraConfig, get_peft_model
    from torch.utils.data import SequentialSampler
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainerCallback, TrainingArguments

    from trainer.data import Collator, prepare
    from trainer.lora import lora_targets

    cfg = train_config(plan, model, [])
    torch.manual_seed(plan.seed)  # as the recipe does, before the adapter is made
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    pad_id = tokenizer.eos_token_id if tokenizer.pad_token_id is None else tokenizer.pad_token_id
    split = prepare(cfg, tokenizer, REPO)
    dtype = torch.bfloat16 if plan.bf16 else torch.float32
    base = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype, attn_implementation="sdpa")
    alpha = int(plan.lora_alpha) if float(plan.lora_alpha).is_integer() else plan.lora_alpha
    lora = LoraConfig(
        r=plan.lora_r,
        lora_alpha=alpha,
        lora_dropout=0.0,
        target_modules=lora_targets(base, cfg),
        bias="none",
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(base, lora).to("cuda" if plan.cuda else "cpu")
    first = eval_loss(peft_model, split.eval, plan, pad_id)
    ordered = [split.train[i] for step in schedule(len(split.train), plan) for batch in step for i in batch]
    notes = ["base model loaded in bf16 (LoRA weights fp32), bf16 mixed precision"] if plan.bf16 else []

    class Tick(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            clock.tick()

    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    settings = hf_arguments(plan, work, fields)
    trainer_cls: Any = Trainer
    if trl:
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer

        rows = [{"input_ids": e.input_ids, "labels": e.labels} for e in ordered]
        config: Any = SFTConfig(**settings, max_length=plan.seq_len, packing=False)
        kwargs = {"train_dataset": Dataset.from_list(rows), "processing_class": tokenizer}
        trainer_cls = SFTTrainer
    else:
        config = TrainingArguments(**settings)
        kwargs = {"train_dataset": ordered, "data_collator": Collator(pad_id)}
    if "train_sampling_strategy" not in fields:  # an older transformers: keep the order all the same

        class Ordered(trainer_cls):  # type: ignore[misc, valid-type]
            def _get_train_sampler(self, *args: Any, **kw: Any) -> Any:
                return SequentialSampler(self.train_dataset)

        trainer_cls = Ordered
        notes.append("sequential order through _get_train_sampler (no train_sampling_strategy here)")
    trainer = trainer_cls(model=peft_model, args=config, callbacks=[Tick()], **kwargs)
    trainer.train()
    return {
        "eval_loss": eval_loss(peft_model, split.eval, plan, pad_id),
        "eval_loss_first": first,
        "trainable_params": sum(p.numel() for p in peft_model.parameters() if p.requires_grad),
        "notes": notes,
    }


def peak_mem_mib(cuda: bool) -> float:
    """CUDA's max_memory_allocated on a GPU, else this process's peak RSS (Linux reports KiB)."""
    if cuda:
        import torch

        return torch.cuda.max_memory_allocated() / MIB
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(kind: str, payload: dict[str, Any]) -> None:
    """In a child process: prepare, or train with one trainer; print the RESULT line."""
    if kind == "prepare":
        result = prepare_child(payload)
    else:
        plan, model, work = Plan(**payload["plan"]), Path(payload["model_path"]), Path(payload["work"])
        clock = Clock(plan.cuda)
        if kind == "builtin":
            result = run_builtin(plan, model, work, clock)
        else:
            result = run_hf(plan, model, work, clock, trl=kind == "trl_sft")
        result.update(step_times=clock.times, peak_mem_mib=peak_mem_mib(plan.cuda))
    print(RESULT + json.dumps(result), flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, help="rounds of all trainers (default: 2)")
    parser.add_argument("--steps", type=int, help="optimizer steps per run (default: 60 CPU, 100 GPU)")
    parser.add_argument("--skip", type=int, help="first steps left out of the timing (default 10)")
    parser.add_argument("--micro-batch", type=int, help="micro batch (default: 8 CPU, 256 GPU; divides 768)")
    parser.add_argument("--size", choices=("tiny", "small"), help="model (default: tiny CPU, small GPU)")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU even where CUDA is available")
    parser.add_argument("--only", default=",".join(TRAINERS), help="trainers to run, comma-separated")
    parser.add_argument("--cache-dir", type=Path, default=CACHE, help="where the models are built")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one child may take")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, outputs)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--payload", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args.child, json.loads(args.payload))
        return 0
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="tf-bench-trainer-"))
    try:
        result, status = measure(args, work)
    except Exception as exc:  # noqa: BLE001 - any failure is the result to report, in the JSON line
        result, status = {"bench": "trainer", "ok": False, "error": f"{type(exc).__name__}: {exc}"}, 2
    finally:
        if args.keep:
            say(f"kept {work}")
        else:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    result["seconds"] = round(time.monotonic() - started, 1)
    if "trainers" in result:
        show(result)
    else:
        say(f"FAILED: {result['error']}")
    print(json.dumps(result), flush=True)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
