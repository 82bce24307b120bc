"""The node's software setup: what a rented node's start script runs (providers.bootstrap) before Ray, so
that any reasonable image trains, not only the node image (docker/node.Dockerfile).

It runs on the node as `python3 -c SOURCE` with the image's python3: the standard library only, nothing of
the fleet's. It compares what the image has with the fleet's pins (FLEET_NODE_PINS: the node's software,
trainer/requirements-node.txt, at the exact versions the fleet runs), and installs what is missing or at
another version: into the image's own venv when its python3 is one, else into a venv on the container
disk (FLEET_NODE_VENV, default /opt/trainfleet/venv, else ~/.trainfleet/venv) that sees the image's
packages, so that its CUDA build of torch is kept; pip's cache is on the node's root (FLEET_NODE_ROOT, the
volume when there is one) so that a restarted container installs from it. torch counts as there in any
version: the image's CUDA build matters more than equal digits. An image whose Python is not the fleet's
(FLEET_NODE_PYTHON_VERSION, X.Y) gets a venv with that Python from uv, and everything in it.

It chooses the node's root (FLEET_NODE_ROOT when the provider set one, on its volume; else the first
directory of /workspace/trainfleet, ~/trainfleet, /tmp/trainfleet this user can write), writes what it did
to <root>/node-setup.json (seconds, what was installed, the interpreter, or the error), which the readiness
check reports as the `node.setup` event, and prints the root and the PATH Ray must start with as shell
exports, for the start script to `eval`. A failed install still prints the image's own bin directory: Ray
starts, and the readiness check names what is missing, so the run fails NODE_BROKEN instead of timing out.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import metadata

PINS_ENV = "FLEET_NODE_PINS"
PYTHON_ENV = "FLEET_NODE_PYTHON_VERSION"
VENV_ENV = "FLEET_NODE_VENV"
PIP_ARGS_ENV = "FLEET_NODE_PIP_ARGS"  # extra pip arguments (an index mirror; tests: a local wheel folder)
ROOT_ENV = "FLEET_NODE_ROOT"
ROOTS = ("/workspace/trainfleet", "~/trainfleet", "/tmp/trainfleet")  # the first one writable
RESULT = "node-setup.json"
LOG = "node-setup.log"
VENVS = ("/opt/trainfleet/venv", "~/.trainfleet/venv")
ANY_VERSION = ("torch",)  # the image's build (CUDA) is kept whatever its version
PIN = re.compile(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?==([^\s;]+)$")
DIRECT = re.compile(r"^([A-Za-z0-9_.-]+)@(git\+\S+)$")  # `name@git+URL[@ref]`: a fork (axolotl_git)


def split_source(source: str) -> tuple[str, str | None]:
    """`git+URL[@ref]` -> (URL, ref), as pip records them in direct_url.json (`url`, `requested_revision`)."""
    url = source[len("git+") :] if source.startswith("git+") else source
    head, _, last = url.rpartition("/")
    if "@" in last:
        last, _, ref = last.partition("@")
        return f"{head}/{last}", ref
    return url, None


def installed_from(name: str) -> dict[str, object] | None:
    """What pip recorded of where `name` came from (its direct_url.json: `url`, `vcs_info`); None when it
    is not installed, {} when it came from an index."""
    try:
        text = metadata.distribution(name).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    try:
        found = json.loads(text) if text else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def from_source(name: str, source: str) -> bool:
    """Whether `name` is installed from the git `source` (its URL, and its ref when it names one: the
    branch asked for, or the commit got)."""
    url, ref = split_source(source)
    found = installed_from(name) or {}
    vcs = found.get("vcs_info")
    vcs = vcs if isinstance(vcs, dict) else {}
    if found.get("url") != url or vcs.get("vcs") != "git":
        return False
    return ref is None or ref in (vcs.get("requested_revision"), vcs.get("commit_id"))


def _requirement(pin: str) -> str:
    """A pin as pip reads it: a direct reference with the spaces PEP 508 allows (`name @ url`), which pip
    needs to tell it from a path (the pins travel space-separated, so they come without)."""
    direct = DIRECT.match(pin)
    return f"{direct.group(1)} @ {direct.group(2)}" if direct else pin


def missing(pins: list[str]) -> list[str]:
    """The pins this interpreter does not satisfy (not installed, or another version or source)."""
    out = []
    for pin in pins:
        direct = DIRECT.match(pin)
        if direct is not None:
            if not from_source(direct.group(1), direct.group(2)):
                out.append(pin)
            continue
        match = PIN.match(pin)
        if match is None:
            raise ValueError(f"not a pin: {pin!r}")
        name, _extras, version = match.groups()
        try:
            have = metadata.version(name).split("+")[0]
        except metadata.PackageNotFoundError:
            out.append(pin)
            continue
        if have != version and name.lower() not in ANY_VERSION:
            out.append(pin)
    return out


def _writable(folder: str) -> bool:
    """Whether this user can make (if need be) and write `folder`."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK)


def _venv_dir(env: dict[str, str]) -> str:
    if env.get(VENV_ENV):
        return env[VENV_ENV]
    for candidate in VENVS:
        path = os.path.expanduser(candidate)
        if _writable(os.path.dirname(path)):
            return path
    return os.path.expanduser(VENVS[-1])


def _run(argv: list[str], log: str, extra_path: str | None = None) -> None:
    environ = dict(os.environ)
    if extra_path:
        environ["PYTHONPATH"] = extra_path
    with open(log, "a") as out:
        out.write("$ " + " ".join(argv) + "\n")
        out.flush()
        subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=True, timeout=3600, env=environ)


class _Install:
    """One install: where the log, pip's cache and the extra pip arguments are."""

    def __init__(self, env: dict[str, str], root: str) -> None:
        self.log = os.path.join(root, LOG)
        self.pip_args = env.get(PIP_ARGS_ENV, "").split()
        self.cache = ["--cache-dir", os.path.join(root, "cache", "pip")]
        self.uv_dir = os.path.join(root, "cache", "uv")
        self.python_version = env.get(PYTHON_ENV, "")

    def run(self, argv: list[str]) -> None:
        _run(argv, self.log)

    def uv(self, *args: str) -> None:
        """uv, installed beside the node's root (not into the image's Python, which may refuse it)."""
        if not os.path.isdir(os.path.join(self.uv_dir, "uv")):
            pip = [sys.executable, "-m", "pip", "install", "-q", "--target", self.uv_dir]
            _run([*pip, *self.cache, *self.pip_args, "uv"], self.log)
        _run([sys.executable, "-m", "uv", *args], self.log, extra_path=self.uv_dir)


def install(pins: list[str], env: dict[str, str], root: str) -> tuple[str, list[str]]:
    """Install what this interpreter lacks of `pins` into a venv; return its bin directory and what was
    installed. Without the fleet's Python, or without `venv` (Debian's python3 lacks ensurepip), uv makes
    the venv."""
    wanted = env.get(PYTHON_ENV, "")
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    venv = _venv_dir(env)
    job = _Install(env, root)
    python = os.path.join(venv, "bin", "python")
    todo = pins if wanted and wanted != here else missing(pins)
    if not todo:
        return os.path.dirname(sys.executable), []
    with _exclusive(venv + ".lock"):  # two nodes of one home (pool machines) install one at a time
        return _install_into(venv, python, todo, job, wanted != "" and wanted != here)


@contextlib.contextmanager
def _exclusive(path: str) -> Iterator[None]:
    """An exclusive lock on the file `path` for the `with` block; none where it cannot be made (the
    install then goes on unlocked, as it always did)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _install_into(
    venv: str, python: str, todo: list[str], job: _Install, other_python: bool
) -> tuple[str, list[str]]:
    # A venv is made once: making it again would rewrite its pyvenv.cfg under the nodes that run from it
    # (two nodes of one home), whose new processes would then miss the packages it lets them see.
    made = os.path.exists(os.path.join(venv, "pyvenv.cfg"))
    if other_python:  # another Python: uv brings it, and everything goes into its venv
        if not made:
            job.uv("venv", "--python", job.python_version, venv)
    elif sys.prefix != sys.base_prefix and os.access(sys.prefix, os.W_OK):
        venv, python = sys.prefix, sys.executable  # the image's python is a venv already: add to it
    elif not made:
        try:
            job.run([sys.executable, "-m", "venv", "--system-site-packages", venv])
        except subprocess.CalledProcessError:
            job.uv("venv", "--system-site-packages", "--python", sys.executable, venv)
    asked = [_requirement(pin) for pin in todo]
    if os.path.exists(os.path.join(venv, "bin", "pip")):
        job.run([python, "-m", "pip", "install", "-q", *job.cache, *job.pip_args, *asked])
    else:  # a uv venv has no pip
        job.uv("pip", "install", "--python", python, *job.pip_args, *asked)
    return os.path.join(venv, "bin"), todo


def node_root(env: dict[str, str]) -> str:
    """The node's root: FLEET_NODE_ROOT when its provider set one (on its volume), else the first of ROOTS
    this user can write (an image may run as a user other than root)."""
    for root in (env.get(ROOT_ENV), *ROOTS):
        if root and _writable(os.path.expanduser(root)):
            return os.path.expanduser(root)
    return ROOTS[-1]


def main(env: dict[str, str]) -> int:
    """Set the node up; print, for the start script to `eval`, the exports of its root and of a PATH that
    leads to the interpreter Ray must start from."""
    root = node_root(env)
    started = time.time()
    pins = env.get(PINS_ENV, "").split()
    result: dict[str, object] = {"python": sys.executable}
    bin_dir = os.path.dirname(sys.executable)
    try:
        bin_dir, installed = install(pins, env, root)
        result.update(installed=installed, python=os.path.join(bin_dir, "python"))
        if installed:
            result["venv"] = os.path.dirname(bin_dir)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        result.update(installed=[], error=f"{type(exc).__name__}: {exc}"[:500])
    result["seconds"] = round(time.time() - started, 1)
    try:
        with open(os.path.join(root, RESULT), "w") as out:
            json.dump(result, out)
    except OSError as exc:
        sys.stderr.write(f"trainfleet node setup: cannot write {RESULT}: {exc}\n")
    sys.stdout.write(f"export {ROOT_ENV}={shlex.quote(root)}\n")
    sys.stdout.write(f'export PATH={shlex.quote(bin_dir)}:"$PATH"\n')
    return 0


if __name__ == "__main__":
    sys.exit(main(dict(os.environ)))
