"""The GPU node check: can this machine train a trainfleet job on its GPU, and how fast?

    python3 bench/gpu_node.py [--python PATH] [--build-env] [--gpus 1] [--allow-cpu] [--max-steps N]
                              [--allow-missing ray,wandb] [--variants all|none|a,b,...] [--variant-steps 8]

Works offline, with the repository alone. It picks the node's interpreter: `--python PATH` if given, else
this interpreter if it has the node's packages (trainer/requirements-node.txt), else the repository's
.venv-node, else, only with `--build-env` and a reachable package index, a venv it builds in
out/gpu-node-venv. Then it runs the node's readiness check (`python -m trainer check --gpus N`, as the
fleet does before a node counts as ready) and trains the tiny example job (configs/examples/tiny-lora.yml)
with the builtin recipe in one process (`use_ray: false`) on CUDA, in bf16 where torch says the GPU supports
it: the job's `bf16: true` (`bf16_via`), never an autocast around the recipe (trainer.precision says why);
`--precision fp32` sets `bf16: false`, float32 throughout).
`--allow-missing ray,wandb` accepts an interpreter without those (one process trains without them, as on a
bare GPU machine with the other packages carried in on PYTHONPATH, which the children keep); the readiness
check then reports them, so such a run is never `ok`.

After the main run (passed or not), the GPU-only paths of the recipe, each trained briefly in its own child
(bench/gpu_variants.py): (a) qlora, (b) 8-bit, (c) fp16 + sdp_attention + tf32, (d) flash_attention,
(e) a qlora save and resume. `--variants` picks them (default: all on CUDA, none on a CPU); on a CPU each
must be refused with the recipe's clear error (`expected_failure_ok`). The JSON line's `variants` holds each
outcome, `variants_by_status` the letters by status, `variant_libraries` bitsandbytes' and flash-attn's
versions (a variant whose library is missing is `skipped`, which does not count against `ok`).

It prints what it does, then as its LAST line one JSON object: the interpreter used and why, torch and
CUDA versions, the GPU, bf16, training steps/s (measured between STEP progress lines, leaving out the
intervals with an evaluation or checkpoint), peak GPU memory, eval loss first -> last, the readiness
check's result, the variants, seconds. Without CUDA it says `"cuda": false` and refuses to train unless
`--allow-cpu` is passed; `"ok"` is true only for a CUDA run whose check found no problem, whose eval loss
fell, and whose variants all passed (or were skipped). Exit status: 0 ok (or a finished `--allow-cpu`
run whose variants were refused as expected), 1 training or a variant failed or did not learn, 2 setup.

The script itself needs only the standard library (3.9+); the training runs in a child process (this file
with `--child`) under the chosen interpreter.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# Run as a script, this file's folder comes first on sys.path, where bench/trainer.py would hide the
# repository's trainer package: the repository comes first instead, and the siblings are `bench.<name>`.
sys.path[:] = [
    str(REPO),
    *(p for p in sys.path if Path(p or ".").resolve() not in (REPO, Path(__file__).resolve().parent)),
]

CUDA_PROBE = """import json, torch
cuda = torch.cuda.is_available()
n = torch.cuda.device_count() if cuda else 0
print(json.dumps({"torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda": cuda,
    "cudnn": torch.backends.cudnn.version() if cuda else None, "device_count": n,
    "gpu_names": [torch.cuda.get_device_name(i) for i in range(n)],
    "capability": list(torch.cuda.get_device_capability(0)) if cuda else None,
    "bf16_supported": bool(cuda and torch.cuda.is_bf16_supported())}))"""


# bench/gpu_env.py: the node's interpreter and its readiness check; bench/gpu_child.py: the main run's child;
# bench/gpu_variants.py: the variants (bench/gpu_variants_child.py, their child, loads only in a child).
from bench import gpu_child, gpu_env, gpu_variants  # noqa: E402

SetupError, say, tail = gpu_env.SetupError, gpu_env.say, gpu_env.tail


def rounded(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else value


def throughput(timed: list[tuple[float, dict[str, Any]]]) -> float | None:
    """Optimizer steps per second between consecutive STEP lines, over the intervals with nothing else in
    them (an eval, a checkpoint or a rollback would count as training time otherwise)."""
    steps = seconds = 0.0
    previous: tuple[float, int] | None = None
    for t, record in timed:
        if record.get("kind") != "step":
            previous = None
            continue
        if previous is not None and t > previous[0]:
            steps += record["step"] - previous[1]
            seconds += t - previous[0]
        previous = (t, record["step"])
    return round(steps / seconds, 3) if seconds > 0 else None


def show(record: dict[str, Any]) -> None:
    kind = record.get("kind")
    if kind == "started":
        say(f"training: {record.get('total_steps')} steps, {record.get('train_examples')} examples")
    elif kind == "step":
        loss = record.get("loss", float("nan"))
        say(f"  step {record['step']}/{record.get('total_steps')}  loss {loss:.4f}")
    elif kind == "eval":
        say(f"  eval at step {record.get('step')}: eval_loss {record.get('eval_loss')}")


def train(python: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Train the tiny job in a child process; its result with steps/s from the timed progress lines."""
    argv = [python, str(Path(__file__).resolve()), "--child", str(work), f"--precision={args.precision}"]
    argv += [f"--max-steps={args.max_steps}"] if args.max_steps else []
    log = work / "child-stderr.log"
    timed: list[tuple[float, dict[str, Any]]] = []
    result: dict[str, Any] | None = None
    with open(log, "w") as err:
        child = subprocess.Popen(
            argv, cwd=REPO, env=gpu_env.child_env(), stdout=subprocess.PIPE, stderr=err, text=True
        )
        fired = threading.Event()

        def kill() -> None:
            fired.set()
            child.kill()

        timer = threading.Timer(args.timeout, kill)
        timer.start()
        try:
            assert child.stdout is not None
            for line in child.stdout:
                now = time.monotonic()
                if line.startswith(gpu_child.RESULT):
                    result = json.loads(line[len(gpu_child.RESULT) :])
                for record in gpu_env.progress_records(line):
                    timed.append((now, record))
                    show(record)
            code = child.wait()
        finally:
            timer.cancel()
    if result is None or code != 0:
        why = f"timed out after {args.timeout:g} s" if fired.is_set() else f"exit {code}"
        raise RuntimeError(f"training failed ({why}): {tail(log.read_text(errors='replace'), 5)}")
    result["steps_per_s"] = throughput(timed)
    return result


def verdict(result: dict[str, Any], trained: dict[str, Any] | None) -> int:
    """Fill in the training's figures and `ok`; return the exit status."""
    got = trained or {}
    metrics = got.get("metrics", {})
    first, last = metrics.get("eval_loss_first"), metrics.get("eval_loss")
    learned = isinstance(first, float) and isinstance(last, float) and math.isfinite(last) and last < first
    steps, train_s = metrics.get("global_step"), got.get("train_s")
    result.update(
        device=got.get("device"),
        bf16=bool(got.get("bf16")),
        bf16_via=got.get("bf16_via"),
        steps=steps,
        steps_per_s=got.get("steps_per_s"),
        steps_per_s_overall=round(steps / train_s, 3) if steps and train_s else None,
        peak_gpu_mem_mib=got.get("peak_gpu_mem_mib"),
        peak_gpu_reserved_mib=got.get("peak_gpu_reserved_mib"),
        eval_loss_first=first,
        eval_loss_last=last,
        learned=learned if trained else None,
        train_s=train_s,
    )
    refused = str(result["error"]).startswith("no CUDA")
    why_not = ["no CUDA"] if result["cuda"] is False and not refused else []
    if result["check"].get("status") != "ok":
        why_not.append(f"readiness check: {result['check'].get('status', 'not run')}")
    if trained and not learned:
        why_not.append("the eval loss did not fall")
    if result["error"]:
        why_not.append(result["error"])
    variant_problems = result.get("variant_problems") or []
    why_not += variant_problems
    result["ok"], result["why_not"] = not why_not and bool(trained), why_not
    if result["ok"]:
        return 0
    if result["error"]:
        return 1 if result["trained"] is False else 2
    cpu_run_done = trained and learned and not result["cuda"] and not variant_problems  # --allow-cpu
    return 0 if cpu_run_done else 1


def driver() -> str | None:
    """nvidia-smi's word on the first GPU (name, driver, memory), when there is one."""
    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        done = subprocess.run(query, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


def measure(args: argparse.Namespace, result: dict[str, Any]) -> dict[str, Any] | None:
    """Environment, CUDA, readiness check, training: fills `result` as it goes; the training's result."""
    ray = gpu_env.fleet_ray()
    env = gpu_env.choose_env(args, ray)
    result["env"] = {k: env[k] for k in ("interpreter", "source", "why", "python")}
    result["python"] = env["python"]
    say(f"interpreter: {env['interpreter']} (Python {env['python']}): {env['why']}")
    required = gpu_env.requirements().get("ray")
    result["ray"] = {"node": env["versions"].get("ray"), "fleet": ray, "required": required}
    python = env["interpreter"]
    cuda = gpu_env.run_json([python, "-c", CUDA_PROBE], 120, "torch's CUDA probe")
    result.update(cuda)
    result["gpu_name"] = cuda["gpu_names"][0] if cuda["gpu_names"] else None
    result["nvidia_smi"] = driver()
    say(
        f"torch {cuda['torch']} (CUDA {cuda['torch_cuda']}), cuda available: {cuda['cuda']}, "
        f"GPUs: {cuda['device_count']} {cuda['gpu_names']}, bf16: {cuda['bf16_supported']}"
    )
    result["check"] = check = gpu_env.readiness(python, args.gpus, ray)
    say(f"readiness check: {check['status']} {check.get('problems') or check.get('message') or ''}".rstrip())
    if not cuda["cuda"] and not args.allow_cpu:
        raise SetupError(
            "no CUDA: torch sees no GPU; refusing to train (--allow-cpu trains on the CPU, which "
            "says nothing about a GPU node)"
        )
    if not cuda["cuda"]:
        say("warning: no CUDA; training on the CPU because of --allow-cpu (this is not a GPU result)")
    work = Path(tempfile.mkdtemp(prefix="tf-gpu-node-"))
    result["trained"] = False  # until it has
    try:
        failed, trained = None, None
        try:
            trained = train(python, args, work)
        except RuntimeError as exc:  # the variants run all the same: a GPU session is short
            failed = exc
        variants(args, result, python, work, cuda["cuda"])
        if failed is not None:
            raise failed
        return trained
    finally:
        if args.keep:
            say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def variants(args: argparse.Namespace, result: dict[str, Any], python: str, work: Path, cuda: bool) -> None:
    """Run the variants `--variants` asks for (gpu_variants) into `result`."""
    chosen = gpu_variants.plan(args.variants, cuda)
    timeout = min(args.timeout, gpu_variants.TIMEOUT_S)
    script = Path(__file__).resolve()
    steps, env = args.variant_steps, gpu_env.child_env()
    libraries, outcomes = gpu_variants.run_plan(
        chosen,
        cuda=cuda,
        python=python,
        script=script,
        work=work,
        env=env,
        steps=steps,
        timeout=timeout,
        say=say,
    )
    result["variant_libraries"] = libraries
    result["variants"] = [o.to_json() for o in outcomes]
    result["variants_by_status"] = gpu_variants.tally(outcomes)
    result["variant_problems"] = gpu_variants.problems(outcomes)


def variant_choice(text: str) -> list[str]:
    try:
        chosen: list[str] = gpu_variants.parse_choice(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return chosen


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--python", help="the node's interpreter (default: this one, else .venv-node)")
    parser.add_argument("--build-env", action="store_true", help="else build one from the package index")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs the readiness check asks for (default 1)")
    parser.add_argument("--allow-cpu", action="store_true", help="train on the CPU when there is no CUDA")
    parser.add_argument(
        "--allow-missing",
        default="",
        metavar="NAMES",
        help="node packages the interpreter may lack (e.g. ray,wandb: one-process training needs neither)",
    )
    parser.add_argument(
        "--precision",
        choices=("auto", "bf16", "fp32"),
        default="auto",
        help="auto: bf16 where the GPU supports it (default); fp32: bf16: false",
    )
    parser.add_argument("--max-steps", type=int, default=None, help="stop after N steps (default: the job's)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds the training may take")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (outputs, logs)")
    parser.add_argument(
        "--variants",
        type=variant_choice,
        default=None,
        metavar="all|none|a,b,...",
        help="the GPU-only paths to train after the main run: a qlora, b 8bit, c fp16, d flash, e resume "
        "(default: all on CUDA, none on a CPU)",
    )
    parser.add_argument(
        "--variant-steps",
        type=int,
        default=gpu_variants.DEFAULT_STEPS,
        help=f"steps of each variant (default {gpu_variants.DEFAULT_STEPS})",
    )
    parser.add_argument("--child", metavar="WORK", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # with --child: train that variant
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.python and os.sep in args.python:
        args.python = os.path.abspath(args.python)  # the node's processes run in the repository
    if args.child and args.variant:
        import yaml

        raw, steps = gpu_child.tiny_job(yaml), args.max_steps or gpu_variants.DEFAULT_STEPS
        from bench import gpu_variants_child as variant_child

        code: int = variant_child.child(Path(args.child), args.variant, steps, raw, gpu_child.JOB_YAML.parent)
        return code
    if args.child:
        gpu_child.child(Path(args.child), args.precision, args.max_steps)
        return 0
    started = time.monotonic()
    result: dict[str, Any] = {"bench": "gpu_node", "ok": False, "cuda": None, "gpu_name": None}
    result.update(error=None, trained=None, check={})
    trained = None
    try:
        trained = measure(args, result)
        result["trained"] = True
    except SetupError as exc:
        result["error"] = str(exc)
    except Exception as exc:  # noqa: BLE001 - any failure is the result to report, in the JSON line
        result["error"] = f"{type(exc).__name__}: {exc}"
    status = verdict(result, trained)
    result["seconds"] = round(time.monotonic() - started, 1)
    if trained:
        memory = f", peak GPU memory {result['peak_gpu_mem_mib']} MiB" if result["cuda"] else ""
        say(
            f"{result['steps']} steps on {result['device']} (bf16: {result['bf16']}): "
            f"{result['steps_per_s']} steps/s{memory}, "
            f"eval_loss {rounded(result['eval_loss_first'])} -> {rounded(result['eval_loss_last'])}"
        )
    verdict_line = "OK" if result["ok"] else "NOT OK: " + "; ".join(result["why_not"])
    say(f"{verdict_line} ({result['seconds']} s)")
    print(json.dumps(result), flush=True)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
