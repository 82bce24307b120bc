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
true`; nothing runs it under an outer autocast), micro batch 256, 100 steps, 2 rounds.

The last line printed is one JSON object with all of it. Exit status: 0 when every trainer asked for ran
(goals met or not), 1 when one failed, 2 when the setup failed. A benchmark: it never gates CI.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# Run as a script, this file's folder comes first on sys.path, and `import trainer` would find this file:
# the repository's trainer package is meant. The siblings are `bench.<name>`.
sys.path[:] = [
    str(REPO),
    *(p for p in sys.path if Path(p or ".").resolve() not in (REPO, Path(__file__).resolve().parent)),
]

CACHE = REPO / "out" / "bench-models"
TRAINERS = ("builtin", "hf_trainer", "trl_sft")


# bench/trainer_figures.py: the plan and the figures (no torch); bench/trainer_children.py: the children.
from bench import trainer_children as children  # noqa: E402
from bench import trainer_figures as figures  # noqa: E402


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
    found = [ln for ln in done.stdout.splitlines() if ln.startswith(children.RESULT)]
    if done.returncode != 0 or not found:
        lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
        return {"error": f"{kind}: exit {done.returncode}: {' | '.join(lines[-3:])} (log: {log})"}
    result: dict[str, Any] = json.loads(found[-1][len(children.RESULT) :])
    result["wall_s"] = round(wall, 2)
    return result


def say(text: str) -> None:
    print(f"bench.trainer: {text}", flush=True)


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
        for name in figures.order(r, names):
            where = work / f"{name}-{r + 1}"
            job = {"plan": plan, "model_path": prep["model_path"], "work": str(where)}
            got = run_child(name, job, where, args.timeout)
            runs[name].append(got)
            if "error" in got:
                say(f"round {r + 1} {name}: FAILED: {got['error']}")
                continue
            window = figures.timed_window(got["step_times"], prep["steps"], plan["skip"])
            say(
                f"round {r + 1} {name}: {window.tokens / window.seconds:.1f} tokens/s, peak "
                f"{got['peak_mem_mib']:.1f} MiB, eval loss {got['eval_loss']:.4f} ({got['wall_s']} s)"
            )
    result = figures.report(prep, runs, {k: v for k, v in skipped.items()})
    result["error"] = None
    return result, 0 if result["ok"] else 1


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
        children.child(args.child, json.loads(args.payload))
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
