"""`python -m trainer check --gpus N --python X.Y --ray V`: can this node train? Run by the fleet as a Ray
job on a node's head before the node counts as ready, with the interpreter that will train.

It checks what a run needs of the node's software and hardware: this Python's version and Ray's equal the
fleet's (given as arguments), torch, transformers and peft import, the other libraries the trainer uses are
installed, and, when the run's section asks for GPUs, CUDA sees at least that many, unless the node says
it is a CPU stand-in (a marker only the test fakes set, in the node's own environment). A job for axolotl
(`--axolotl VERSION`, or `any`) also needs axolotl installed at that version and `axolotl.cli.main`
importable (what trainer.axolotl_run starts). It prints one CHECKED
progress line with what it found and the problems, and exits 0 whenever it could look (the fleet reads the
problems); anything else is the fleet's cue that the node is broken beyond checking.

Standard library at import time: a node that lacks everything must still be able to say so.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

from trainer.progress import NODE_ROOT_ENV, Kind, emit

CPU_STANDIN_ENV = "FLEET_CPU_STANDIN"  # set only by the test fakes' nodes: "1" means no GPUs, on purpose
SETUP_FILE = "node-setup.json"  # what the node's start script installed (providers.onnode.nodesetup)
IMPORTED = ("torch", "ray", "transformers", "peft")  # imported for real: these must load, not just exist
FOUND = ("tokenizers", "safetensors", "huggingface_hub", "httpx", "pydantic", "yaml", "wandb", "datasets")
DISTRIBUTIONS = {"yaml": "PyYAML", "huggingface_hub": "huggingface_hub"}


class Checked(TypedDict):
    """The CHECKED progress line: what the node has, and what keeps it from training (`problems`)."""

    python: str
    executable: str
    platform: str
    versions: dict[str, str]
    missing: dict[str, str]
    cuda: bool
    cuda_version: str | None
    gpus: int
    gpu_names: list[str]
    bf16: bool
    cpu_standin: bool
    setup: dict[str, Any] | None
    axolotl_source: dict[str, str] | None
    problems: list[str]


def _version(module: str) -> str:
    try:
        return importlib.metadata.version(DISTRIBUTIONS.get(module, module))
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _libraries() -> tuple[dict[str, str], dict[str, str]]:
    """The versions of the trainer's libraries, and why each missing one is missing."""
    versions, missing = {}, {}
    for name in IMPORTED:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any failure to import is what we report
            missing[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            continue
        versions[name] = _version(name)
    for name in FOUND:
        if importlib.util.find_spec(name) is None:
            missing[name] = "not installed"
        else:
            versions[name] = _version(name)
    return versions, missing


def _cuda() -> tuple[bool, str | None, list[str], bool]:
    """Whether torch sees CUDA, its CUDA version, the names of the GPUs it sees, and bf16 support."""
    try:
        import torch
    except Exception:  # noqa: BLE001 - reported as missing already
        return False, None, [], False
    if not torch.cuda.is_available():
        return False, torch.version.cuda, [], False
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return True, torch.version.cuda, names, bool(torch.cuda.is_bf16_supported())


def _setup(environ: dict[str, str]) -> dict[str, Any] | None:
    root = environ.get(NODE_ROOT_ENV)
    if not root:
        return None
    try:
        data = json.loads((Path(root) / SETUP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _axolotl(wanted: str, versions: dict[str, str], missing: dict[str, str]) -> list[str]:
    """Note axolotl's version (or why it is missing); the problem when it is not the `wanted` one."""
    try:
        found = importlib.metadata.version("axolotl")
    except importlib.metadata.PackageNotFoundError:
        missing["axolotl"] = "not installed"
        return []
    try:
        importlib.import_module("axolotl.cli.main")
    except Exception as exc:  # noqa: BLE001 - any failure to import is what we report
        missing["axolotl"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    versions["axolotl"] = found
    if wanted != "any" and found != wanted:
        return [f"axolotl {found} on the node, the job asks for {wanted}"]
    return []


def _axolotl_source() -> dict[str, str] | None:
    """Where axolotl was installed from when it came from git (a fork): its URL, the ref asked for and
    the commit got, as pip recorded them (direct_url.json); None for a release (or no axolotl)."""
    try:
        text = importlib.metadata.distribution("axolotl").read_text("direct_url.json")
        found = json.loads(text) if text else None
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None
    if not isinstance(found, dict):
        return None
    vcs = found.get("vcs_info")
    if not isinstance(vcs, dict) or vcs.get("vcs") != "git":
        return None
    said = {"url": found.get("url"), "commit": vcs.get("commit_id"), "ref": vcs.get("requested_revision")}
    return {k: str(v) for k, v in said.items() if v}


def check(
    gpus: int, python: str | None, ray: str | None, environ: dict[str, str], axolotl: str | None = None
) -> Checked:
    """What this node has against what the run needs: `gpus` per node, the fleet's `python` (X.Y) and
    `ray` versions (None: not compared), and for a job for axolotl its `axolotl` version (`any`: any one)."""
    versions, missing = _libraries()
    axolotl_problems = _axolotl(axolotl, versions, missing) if axolotl else []
    cuda, cuda_version, names, bf16 = _cuda()
    standin = environ.get(CPU_STANDIN_ENV) == "1"
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    problems = []
    if python and here != python:
        problems.append(f"Python {here} on the node, the fleet runs {python}")
    if ray and "ray" in versions and versions["ray"] != ray:
        problems.append(f"Ray {versions['ray']} on the node, the fleet runs {ray}")
    problems += axolotl_problems
    for name, why in missing.items():
        problems.append(f"{name} is missing ({why})")
    if gpus > 0 and len(names) < gpus and not standin:
        plural = "GPU" if gpus == 1 else "GPUs"
        problems.append(f"asked for {gpus} {plural}, CUDA sees {len(names)}")
    return Checked(
        python=platform.python_version(),
        executable=sys.executable,
        platform=platform.platform(terse=True),
        versions=versions,
        missing=missing,
        cuda=cuda,
        cuda_version=cuda_version,
        gpus=len(names),
        gpu_names=names,
        bf16=bf16,
        cpu_standin=standin,
        setup=_setup(environ),
        axolotl_source=_axolotl_source() if axolotl else None,
        problems=problems,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer check", description=__doc__)
    parser.add_argument("--gpus", type=int, default=0, help="GPUs the run's section asks for, per node.")
    parser.add_argument("--python", help="The fleet's Python version, X.Y.")
    parser.add_argument("--ray", help="The fleet's Ray version.")
    parser.add_argument("--axolotl", metavar="VERSION", help="A job for axolotl: its version, or `any`.")
    args = parser.parse_args(argv)
    found = check(args.gpus, args.python, args.ray, dict(os.environ), axolotl=args.axolotl)
    emit(Kind.CHECKED, **found)
    return 0
