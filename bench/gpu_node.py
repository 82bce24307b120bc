"""The GPU node check: can this machine train a trainfleet job on its GPU, and how fast?

    python3 bench/gpu_node.py [--python PATH] [--build-env] [--gpus 1] [--allow-cpu] [--max-steps N]
                              [--allow-missing ray,wandb]

Works offline, with the repository alone. It picks the node's interpreter: `--python PATH` if given, else
this interpreter if it has the node's packages (trainer/requirements-node.txt), else the repository's
.venv-node, else, only with `--build-env` and a reachable package index, a venv it builds in
out/gpu-node-venv. Then it runs the node's readiness check (`python -m trainer check --gpus N`, as the
fleet does before a node counts as ready) and trains the tiny example job (configs/examples/tiny-lora.yml)
with the builtin recipe in one process (`use_ray: false`) on CUDA, in bf16 where torch says the GPU supports
it: the job's `bf16: true` where the recipe has that key, else autocast around the recipe (`bf16_via` says
which; `--precision fp32` for the recipe as the fleet runs a job without the key, which is float32).
`--allow-missing ray,wandb` accepts an interpreter without those (one process trains without them, as on a
bare GPU machine with the other packages carried in on PYTHONPATH, which the children keep); the readiness
check then reports them, so such a run is never `ok`.

It prints what it does, then as its LAST line one JSON object: the interpreter used and why, torch and
CUDA versions, the GPU, bf16, training steps/s (measured between STEP progress lines, leaving out the
intervals with an evaluation or checkpoint), peak GPU memory, eval loss first -> last, the readiness
check's result, seconds. Without CUDA it says `"cuda": false` and refuses to train unless `--allow-cpu`
is passed; `"ok"` is true only for a CUDA run whose check found no problem and whose eval loss fell.
Exit status: 0 ok (or a finished `--allow-cpu` run), 1 training failed or did not learn, 2 setup.

The script itself needs only the standard library (3.9+); the training runs in a child process (this file
with `--child`) under the chosen interpreter.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO / "trainer" / "requirements-node.txt"
JOB_YAML = REPO / "configs" / "examples" / "tiny-lora.yml"
BUILT_ENV = REPO / "out" / "gpu-node-venv"
NODE_VENV = REPO / ".venv-node" / "bin" / "python"
MARKER = "@@fleet "  # trainer.progress.MARKER
RESULT = "@@gpu-node "  # the child's result line
PROVIDER_SECTIONS = ("local", "runpod", "vastai")
MIB = 2**20

PROBE = """import json, platform, sys
import importlib.metadata as m
found, missing = {}, []
for name in json.loads(sys.argv[1]):
    try:
        found[name] = m.version(name)
    except m.PackageNotFoundError:
        missing.append(name)
print(json.dumps({"python": platform.python_version(), "executable": sys.executable,
                  "versions": found, "missing": missing}))"""

CUDA_PROBE = """import json, torch
cuda = torch.cuda.is_available()
n = torch.cuda.device_count() if cuda else 0
print(json.dumps({"torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda": cuda,
    "cudnn": torch.backends.cudnn.version() if cuda else None, "device_count": n,
    "gpu_names": [torch.cuda.get_device_name(i) for i in range(n)],
    "capability": list(torch.cuda.get_device_capability(0)) if cuda else None,
    "bf16_supported": bool(cuda and torch.cuda.is_bf16_supported())}))"""


class SetupError(Exception):
    """The run cannot start (no interpreter with the node's packages, no CUDA, ...): exit 2."""


def say(text: str) -> None:
    print(f"gpu_node: {text}", flush=True)


def requirements() -> dict[str, str]:
    """The node's requirements: distribution name -> its specifier ("==2.60.*"), from the one file."""
    found = {}
    for line in REQUIREMENTS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if match := re.match(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*(.*)", line):
            found[match.group(1)] = match.group(3).strip()
    return found


def fleet_python() -> str:
    """The fleet's Python (X.Y): the lower bound of pyproject's requires-python."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'requires-python\s*=\s*">=\s*(\d+\.\d+)', text)
    return match.group(1) if match else "3.11"


def fleet_ray() -> str | None:
    """The fleet's exact Ray version, where this checkout says: out/node-constraints.txt (`make node-env`)
    or the fleet's .venv. None on a machine with the repository alone."""
    constraints = REPO / "out" / "node-constraints.txt"
    if constraints.exists():
        for line in constraints.read_text(encoding="utf-8").splitlines():
            if match := re.match(r"ray(\[[^\]]*\])?==([\w.+-]+)\s*$", line.strip()):
                return match.group(2)
    for path in sorted(glob.glob(str(REPO / ".venv/lib/python*/site-packages/ray-*.dist-info"))):
        return Path(path).name[len("ray-") : -len(".dist-info")]
    return None


def run_json(argv: list[str], timeout: float, label: str) -> dict[str, Any]:
    """Run `argv` and parse its last stdout line as JSON; SetupError with its stderr's tail otherwise."""
    try:
        done = subprocess.run(
            argv, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SetupError(f"{label}: {exc}") from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise SetupError(f"{label} failed (exit {done.returncode}): {tail(done.stderr, 3)}")
    data = json.loads(lines[-1])
    assert isinstance(data, dict)
    return data


def rounded(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else value


def tail(text: str, n: int) -> str:
    return " | ".join(text.strip().splitlines()[-n:])


def child_env() -> dict[str, str]:
    """The environment for the node's processes: the repository importable, nothing of the fleet's
    (FLEET_*, RAY_*: no fault injection, no cluster to join), no network for the hub or W&B."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "RAY_"))}
    path = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)  # keep carried wheels
    env.update(PYTHONPATH=path, HF_HUB_OFFLINE="1", WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false")
    return env


def probe(python: str) -> dict[str, Any]:
    """What `python` is and which of the node's packages it lacks."""
    names = json.dumps(list(requirements()))
    return run_json([python, "-c", PROBE, names], 60, f"probing {python}")


def index_reachable(python: str) -> bool:
    """Whether pip (as configured here) answers for a package of the node's set, within 30 s."""
    try:
        done = subprocess.run(
            [python, "-m", "pip", "index", "versions", "ray"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def build_env(ray: str | None) -> str:
    """A venv in out/gpu-node-venv with the node's packages from the index (pip's default Linux torch is
    a CUDA build); the fleet's exact Ray when known, and the fleet's other versions (out/node-constraints
    .txt, its torch left out: that one is the fleet's CPU build)."""
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if here != fleet_python():
        say(f"warning: building with Python {here}; the fleet's is {fleet_python()} (the check will say so)")
    if not index_reachable(sys.executable):
        raise SetupError("--build-env: the package index does not answer (offline?); pass --python instead")
    say(f"building {BUILT_ENV.relative_to(REPO)} from {REQUIREMENTS.relative_to(REPO)} (minutes)")
    subprocess.run([sys.executable, "-m", "venv", str(BUILT_ENV)], check=True)
    pins = [f"ray=={ray}"] if ray else []
    frozen = REPO / "out" / "node-constraints.txt"
    if frozen.exists():
        skip = ("torch==", "triton==", "nvidia-", "ray==", "ray[")
        pins += [ln for ln in frozen.read_text().splitlines() if ln and not ln.startswith(skip)]
    constraints = BUILT_ENV / "constraints.txt"
    constraints.write_text("\n".join(pins) + "\n")
    python = str(BUILT_ENV / "bin" / "python")
    pip = [python, "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS), "-c", str(constraints)]
    if subprocess.run(pip, cwd=REPO).returncode != 0:
        raise SetupError(f"--build-env: pip could not install {REQUIREMENTS.name} (see above)")
    return python


def choose_env(args: argparse.Namespace, ray: str | None) -> dict[str, Any]:
    """The interpreter that will train (`interpreter`), why it was chosen (`source`, `why`), and what it
    has (`python`: its version, `versions` of the node's packages). `--python` wins when given."""
    candidates = (
        [(args.python, "given", "given with --python")]
        if args.python
        else [
            (sys.executable, "current", "this interpreter has the node's packages"),
            (str(NODE_VENV), "venv-node", "the repository's .venv-node has the node's packages"),
            (str(BUILT_ENV / "bin" / "python"), "built-before", "built earlier with --build-env"),
        ]
    )
    if args.build_env:
        candidates.append(("", "built", "built now with --build-env"))
    seen = []
    for python, source, why in candidates:
        if source == "built":
            python = build_env(ray)
        elif source != "given" and not Path(python).exists():
            continue
        try:
            found = probe(python)
        except SetupError as exc:
            seen.append(str(exc))
            continue
        if not set(found["missing"]) - set(args.allow_missing.split(",")):
            why += f" ({'; '.join(seen)})" if seen else ""
            if found["missing"]:
                why += f"; lacks {', '.join(found['missing'])} (--allow-missing: the check will say so)"
            return {"interpreter": python, "source": source, "why": why, **found}
        seen.append(f"{python} lacks {', '.join(found['missing'])}")
    hint = "" if args.build_env else " (pass --python PATH, or --build-env where the package index answers)"
    raise SetupError("no interpreter with the node's packages: " + "; ".join(seen) + hint)


def progress_records(text: str) -> list[dict[str, Any]]:
    records = []
    for line in text.splitlines():
        at = line.find(MARKER)
        if at >= 0:
            try:
                records.append(json.loads(line[at + len(MARKER) :]))
            except json.JSONDecodeError:
                continue
    return [r for r in records if isinstance(r, dict)]


def readiness(python: str, gpus: int, ray: str | None) -> dict[str, Any]:
    """`python -m trainer check`: status ok (no problems), problems, absent (no such command yet) or
    failed, with what it found."""
    argv = [python, "-m", "trainer", "check", f"--gpus={gpus}", f"--python={fleet_python()}"]
    argv += [f"--ray={ray}"] if ray else []
    try:
        done = subprocess.run(argv, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "message": "timed out after 180 s", "argv": argv[1:]}
    checked = [r for r in progress_records(done.stdout) if r.get("kind") == "checked"]
    if checked:
        record = checked[-1]
        problems = list(record.get("problems", []))
        keep = ("python", "versions", "missing", "cuda", "cuda_version", "gpus", "gpu_names", "bf16")
        return {
            "status": "problems" if problems or done.returncode else "ok",
            "problems": problems,
            "returncode": done.returncode,
            **{k: record[k] for k in keep if k in record},
        }
    err = done.stderr
    absent = "invalid choice: 'check'" in err or ("No module named" in err and "trainer.nodecheck" in err)
    return {
        "status": "absent" if absent else "failed",
        "returncode": done.returncode,
        "message": tail(done.stderr or done.stdout, 3) or "no CHECKED line",
    }


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
            argv, cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=err, text=True
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
                if line.startswith(RESULT):
                    result = json.loads(line[len(RESULT) :])
                for record in progress_records(line):
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


def child(work: Path, precision: str, max_steps: int | None) -> None:
    """In the node's interpreter: train the tiny job in this process and print the RESULT line."""
    sys.path.insert(0, str(REPO))
    import torch
    import yaml

    from trainer.config import TrainConfig, TrainJob
    from trainer.train import train as train_job

    raw = yaml.safe_load(JOB_YAML.read_text(encoding="utf-8"))
    for key in PROVIDER_SECTIONS:
        raw.pop(key, None)
    raw["use_ray"] = False
    if max_steps:
        raw["max_steps"] = max_steps
    cuda = torch.cuda.is_available()
    bf16 = cuda and precision != "fp32" and torch.cuda.is_bf16_supported()
    if precision == "bf16" and not bf16:
        raise SystemExit("gpu_node: --precision bf16, but torch says this device has no bf16")
    by_key = bf16 and "bf16" in TrainConfig.model_fields  # the recipe's own bf16, else autocast around it
    if by_key:
        raw["bf16"] = True
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
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16 and not by_key):
        metrics = dict(train_job(job, JOB_YAML.parent))
    if cuda:
        torch.cuda.synchronize()
    train_s = time.monotonic() - started
    peak = torch.cuda.max_memory_allocated() / MIB if cuda else None
    reserved = torch.cuda.max_memory_reserved() / MIB if cuda else None
    out = {
        "device": "cuda" if cuda else "cpu",
        "bf16": bf16,
        "bf16_via": ("the job's bf16 key" if by_key else "autocast around the recipe") if bf16 else None,
        "train_s": round(train_s, 3),
        "peak_gpu_mem_mib": None if peak is None else round(peak, 1),
        "peak_gpu_reserved_mib": None if reserved is None else round(reserved, 1),
        "metrics": metrics,
    }
    print(RESULT + json.dumps(out), flush=True)


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
    result["ok"], result["why_not"] = not why_not and bool(trained), why_not
    if result["ok"]:
        return 0
    if result["error"]:
        return 1 if result["trained"] is False else 2
    return 0 if trained and learned and not result["cuda"] else 1  # a CPU run asked for with --allow-cpu


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
    ray = fleet_ray()
    env = choose_env(args, ray)
    result["env"] = {k: env[k] for k in ("interpreter", "source", "why", "python")}
    result["python"] = env["python"]
    say(f"interpreter: {env['interpreter']} (Python {env['python']}): {env['why']}")
    result["ray"] = {"node": env["versions"].get("ray"), "fleet": ray, "required": requirements().get("ray")}
    python = env["interpreter"]
    cuda = run_json([python, "-c", CUDA_PROBE], 120, "torch's CUDA probe")
    result.update(cuda)
    result["gpu_name"] = cuda["gpu_names"][0] if cuda["gpu_names"] else None
    result["nvidia_smi"] = driver()
    say(
        f"torch {cuda['torch']} (CUDA {cuda['torch_cuda']}), cuda available: {cuda['cuda']}, "
        f"GPUs: {cuda['device_count']} {cuda['gpu_names']}, bf16: {cuda['bf16_supported']}"
    )
    result["check"] = check = readiness(python, args.gpus, ray)
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
        return train(python, args, work)
    finally:
        if args.keep:
            say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


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
        help="auto: bf16 autocast where the GPU supports it (default); fp32: as the fleet trains",
    )
    parser.add_argument("--max-steps", type=int, default=None, help="stop after N steps (default: the job's)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds the training may take")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (outputs, logs)")
    parser.add_argument("--child", metavar="WORK", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.python and os.sep in args.python:
        args.python = os.path.abspath(args.python)  # the node's processes run in the repository
    if args.child:
        child(Path(args.child), args.precision, args.max_steps)
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
