"""The images a fake cloud knows, each mapped to the Python environment its nodes run in: never the fleet's
own venv, so that what a node lacks shows here as it would on a rented machine.

A fake cloud pulls only the images it knows (`ImageRegistry`: KNOWN_IMAGES, and what a test registers with
`fake.register_image(name, like=...)`, or `POST /_fake/images` on a fake served on its own). Any other
image fails to boot, as an image that does not exist fails on the real cloud (each vendor shows it in its
own way: tests.fakes.runpod, tests.fakes.vastai), so a misspelled image in the fleet's settings or a job
fails a test instead of running the default image's environment.

- the default image (and an image registered like it): the node environment `make setup` builds
  (.venv-node: the node's software only, trainer/requirements-node.txt), as a stock image is once its
  start script has installed what it lacked;
- `NO_PEFT_IMAGE`: that environment without peft (an image whose install did not happen or failed);
- `REAL_GPU_IMAGE`: the node environment on a node that does not say it is a CPU stand-in, as a real
  machine would not: a GPU section on it fails its readiness check, since CUDA sees no GPU here;
- the fleet's default axolotl image (core.settings.DEFAULT_AXOLOTL_IMAGE): the axolotl environment `make
  axolotl-env` builds (.venv-axolotl: axolotl's own pins and the fleet's Ray), as axolotl's image is once
  its start has added Ray;
- `TEMPLATE_IMAGE` (a RunPod template's) and `TEST_IMAGES` (what the tests' own creates name): the
  default image's environment.

Every other fake node carries the CPU stand-in marker (FLEET_CPU_STANDIN=1, in the node's own environment,
which a job's env cannot set) so that the tests' GPU sections may train on this machine's CPU.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from core.node_settings import DEFAULT_AXOLOTL_IMAGE
from jobs.sections.base import DEFAULT_IMAGE
from providers.bootstrap import SETUP_ENV, SETUP_LOADER
from providers.local.client import FLEET_ONLY_ENV, axolotl_python, node_python
from providers.onnode import nodesetup
from trainer.nodecheck import CPU_STANDIN_ENV

NO_PEFT_IMAGE = "trainfleet-test/no-peft:latest"
REAL_GPU_IMAGE = "trainfleet-test/not-a-standin:latest"
# The image of the RunPod fake's proof-of-concept template (tests.fakes.runpod.TEMPLATES).
TEMPLATE_IMAGE = "winglian/axolotl-runpod:main-py3.10-cu118-2.0.1"
TEST_IMAGES = ("img", "img:1", "i", "x")  # what the tests' own creates name, each the default image
# Every image the fakes know, by name -> the image whose node environment it runs (image() maps those).
KNOWN_IMAGES: dict[str, str] = {
    DEFAULT_IMAGE: DEFAULT_IMAGE,
    DEFAULT_AXOLOTL_IMAGE: DEFAULT_AXOLOTL_IMAGE,
    NO_PEFT_IMAGE: NO_PEFT_IMAGE,
    REAL_GPU_IMAGE: REAL_GPU_IMAGE,
    TEMPLATE_IMAGE: DEFAULT_IMAGE,
    **dict.fromkeys(TEST_IMAGES, DEFAULT_IMAGE),
}
__all__ = [
    "CPU_STANDIN_ENV",
    "DEFAULT_IMAGE",
    "KNOWN_IMAGES",
    "NO_PEFT_IMAGE",
    "REAL_GPU_IMAGE",
    "ImageRegistry",
    "NodeImage",
    "PullLogin",
    "image",
]


@dataclass
class ImageRegistry:
    """The images one fake cloud can pull: each name -> the image whose node environment it runs."""

    known: dict[str, str] = field(default_factory=lambda: dict(KNOWN_IMAGES))
    private: dict[str, PullLogin] = field(default_factory=dict)  # image -> the one login that pulls it

    def register(self, name: str, like: str = DEFAULT_IMAGE) -> None:
        """Make `name` pullable, its nodes running the environment of the known image `like`."""
        if not name or any(c.isspace() for c in name):
            raise ValueError(f"an image name is one word, not {name!r}")
        runs = self.known.get(like)
        if runs is None:
            raise ValueError(f"cannot register {name!r} like {like!r}: no such known image")
        self.known[name] = runs

    def register_private(self, name: str, login: PullLogin, like: str = DEFAULT_IMAGE) -> None:
        """Make `name` an image of a private repository of `login.server`: pulled only with that login."""
        self.register(name, like)
        self.private[name] = login

    def register_from(self, body: object) -> tuple[int, dict[str, object]]:
        """`POST /_fake/images {"name": ..., "like": ...}` (`like`: the default image when absent), for a
        fake served on its own: (HTTP status, answer)."""
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            return 400, {"error": 'expected {"name": <image>, "like": <a known image>}'}
        try:
            self.register(body["name"], str(body.get("like") or DEFAULT_IMAGE))
        except ValueError as exc:
            return 400, {"error": str(exc)}
        return 200, {"images": sorted(self.known)}

    def runs_as(self, name: str | None) -> str | None:
        """The image whose environment a node of `name` runs, or None: the cloud cannot pull `name`."""
        return self.known.get(name) if name else None

    def pull_error(self, name: str | None, login: PullLogin | None = None) -> str | None:
        """Why pulling `name` with `login` (docker's, on the host: None, anonymous) fails (None: it does not),
        in the words of docker's daemon: an image that does not exist, or that is private and the login is
        not its registry's (the registry answers "denied" for a repository it has not got or will not
        show), or a login its registry refuses."""
        wanted = self.private.get(name or "")
        if wanted is None or self.runs_as(name) is None:
            return None if self.runs_as(name) is not None else self._missing(name)
        if login is None or login.server not in (None, wanted.server):
            return self._missing(name)
        if (login.user, login.token) != (wanted.user, wanted.token):
            refused = "unauthorized: incorrect username or password"
            return f'Error response from daemon: Get "https://{wanted.server}/v2/": {refused}'
        return None

    @staticmethod
    def _missing(name: str | None) -> str:
        if not name:
            return "Error response from daemon: no image given"
        repository = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
        return (
            f"Error response from daemon: pull access denied for {repository}, repository does not exist "
            "or may require 'docker login': denied: requested access to the resource is denied"
        )


@dataclass(frozen=True)
class PullLogin:
    """A docker login on the host that pulls: the registry it is for (None: a RunPod auth, which names no
    registry and is tried on the image's own), a user and a token."""

    server: str | None
    user: str
    token: str


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
        """Run the node's software setup as its start script would (providers.onnode.nodesetup, from the
        instance's environment, with this image's Python), before its Ray starts: it writes what it did to
        the node's root, which the readiness check reports (`node.setup`). A fake node reaches no package
        index and no git host (a fork of axolotl, `axolotl_git`, is not cloned: git may use files only), so
        what its image lacks stays missing (and the readiness check says so)."""
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
                "GIT_ALLOW_PROTOCOL": "file",  # nothing from the network (--no-index does not stop git)
            }
        )
        loader = SETUP_LOADER
        subprocess.run(
            [str(self.python), "-c", loader], env=run_env, capture_output=True, timeout=120, check=False
        )


def image(name: str | None) -> NodeImage:
    """The environment of the image called `name` (None or any other: the default image's). A fake cloud
    boots only the images its ImageRegistry knows, passing here the image whose environment it runs."""
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
