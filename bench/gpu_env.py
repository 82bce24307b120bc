"""bench/gpu_node.py's node interpreter: which one trains (the one given, this one, the repository's
.venv-node, or a venv built from the package index), what it has, the environment of the node's processes,
and its readiness check (`python -m trainer check`). Standard library only; bench/gpu_node.py loads this file
by its path."""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO / "trainer" / "requirements-node.txt"
BUILT_ENV = REPO / "out" / "gpu-node-venv"
NODE_VENV = REPO / ".venv-node" / "bin" / "python"
MARKER = "@@fleet "  # trainer.progress.MARKER

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
