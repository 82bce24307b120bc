"""The images a fake cloud knows, each mapped to the Python environment its nodes run in: never the fleet's
own venv, so that what a node lacks shows here as it would on a rented machine.

- the default image (and any image the fakes do not know): the node environment `make setup` builds
  (.venv-node: the node's software only, trainer/requirements-node.txt), as a stock image is once its
  start script has installed what it lacked;
- `NO_PEFT_IMAGE`: that environment without peft (an image whose install did not happen or failed);
- `REAL_GPU_IMAGE`: the node environment on a node that does not say it is a CPU stand-in, as a real
  machine would not: a GPU section on it fails its readiness check, since CUDA sees no GPU here;
- the fleet's default axolotl image (core.settings.DEFAULT_AXOLOTL_IMAGE): the axolotl environment `make
  axolotl-env` builds (.venv-axolotl: axolotl's own pins and the fleet's Ray), as axolotl's image is once
  its start has added Ray.

Every other fake node carries the CPU stand-in marker (FLEET_CPU_STANDIN=1, in the node's own environment,
which a job's env cannot set) so that the tests' GPU sections may train on this machine's CPU.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from core.node_settings import DEFAULT_AXOLOTL_IMAGE
from jobs.sections.base import DEFAULT_IMAGE
from providers import nodesetup
from providers.bootstrap import SETUP_ENV, SETUP_LOADER
from providers.local.client import FLEET_ONLY_ENV, axolotl_python, node_python
from trainer.nodecheck import CPU_STANDIN_ENV

NO_PEFT_IMAGE = "trainfleet-test/no-peft:latest"
REAL_GPU_IMAGE = "trainfleet-test/not-a-standin:latest"
__all__ = ["CPU_STANDIN_ENV", "DEFAULT_IMAGE", "NO_PEFT_IMAGE", "REAL_GPU_IMAGE", "NodeImage", "image"]


@dataclass(frozen=True)
class NodeImage:
    """What a node of an image runs: its Python (whose bin/ holds `ray`), and whether it says it is a CPU
    stand-in for the GPUs its section asks for."""

    python: Path
    cpu_standin: bool = True

    def env(self) -> dict[str, str]:
        """What the image puts in its nodes' environment."""
        return {CPU_STANDIN_ENV: "1"} if self.cpu_standin else {}

    def set_up(self, env: Mapping[str, str], root: Path) -> None:
        """Run the node's software setup as its start script would (providers.nodesetup, from the
        instance's environment, with this image's Python), before its Ray starts: it writes what it did to
        the node's root, which the readiness check reports (`node.setup`). A fake node reaches no package
        index, so what its image lacks stays missing (and the readiness check says so)."""
        program = env.get(SETUP_ENV)
        if not program:
            return
        root.mkdir(parents=True, exist_ok=True)
        run_env = {k: v for k, v in os.environ.items() if not k.startswith(FLEET_ONLY_ENV)}
        run_env.update({k: v for k, v in env.items() if not k.startswith("-")})
        run_env.update(
            {
                "FLEET_NODE_ROOT": str(root),
                nodesetup.PIP_ARGS_ENV: "--no-index",
                nodesetup.VENV_ENV: str(root / "venv"),
            }
        )
        loader = SETUP_LOADER
        subprocess.run(
            [str(self.python), "-c", loader], env=run_env, capture_output=True, timeout=120, check=False
        )


def image(name: str | None) -> NodeImage:
    """The environment of the image called `name` (None or unknown: the default image's)."""
    python = node_python()
    if name == NO_PEFT_IMAGE:
        return NodeImage(without(python, "peft"))
    if name == REAL_GPU_IMAGE:
        return NodeImage(python, cpu_standin=False)
    if name == DEFAULT_AXOLOTL_IMAGE:
        return NodeImage(axolotl_python())
    return NodeImage(python)


def without(python: Path, package: str) -> Path:
    """A Python environment like `python`'s less `package` (its modules and its dist-info): a venv beside
    it whose site-packages links every other entry of the original's. Built once, under a lock."""
    source = python.parent.parent
    target = source.with_name(f"{source.name}-no-{package}")
    ready = target / ".complete"
    if ready.exists():
        return target / "bin" / "python"
    with open(f"{source}.{package}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready.exists():
            _build(python, target, package)
    return target / "bin" / "python"


def _build(python: Path, target: Path, package: str) -> None:
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(target)], check=True, timeout=120)
    (found,) = (python.parent.parent / "lib").glob("python3.*/site-packages")
    (site,) = (target / "lib").glob("python3.*/site-packages")
    for entry in found.iterdir():
        name = entry.name.lower()
        if name == package or name.startswith((f"{package}-", f"{package}.")):
            continue
        os.symlink(entry, site / entry.name)
    ray = (python.parent / "ray").read_text().splitlines(keepends=True)
    script = target / "bin" / "ray"
    script.write_text(f"#!{target / 'bin' / 'python'}\n" + "".join(ray[1:]))
    script.chmod(0o755)
    (target / ".complete").touch()
