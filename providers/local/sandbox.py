"""How a local node is kept from the fleet: bubblewrap around every process of it.

A local node runs a job's code (the trainer, and what the job's keys make it import) on the fleet's own
machine. Left as the fleet's own processes, it could read every secret the fleet holds: the environment of
`fleet run` and its workers (/proc/<pid>/environ), the secrets file, the fleet's home with its Redis socket,
sealed tokens and other runs. So a local node runs inside bubblewrap (`bwrap`, the sandbox Flatpak uses):
- its own pid namespace, with a /proc that shows its own processes only, and its own IPC namespace;
- a read-only view of the machine in which the fleet's home, the runs directory, the user's home, /tmp,
  /run/user and the fleet's settings and secrets files are empty;
- its own root (FLEET_NODE_ROOT: the run's files, checkpoints, results, a home) and the local nodes' model
  cache the only places it may write; the node's Python (and the base Python of its venv) visible again,
  read-only, where a hidden directory held them; the GPUs it is given, where there are any;
- when the fleet runs as root (a server, a container, CI), also its own uid and gid (`local_node_uid`,
  no supplementary groups, no capabilities, no new privileges): `setpriv` drops them inside the sandbox
  after bubblewrap has built it, so even what stays in view is only what any user may read.
The network is shared: the fleet reaches the node's Ray head on 127.0.0.1, and the node downloads from the
Hub. What listens on this machine's loopback is reachable from the node (each of the fleet's services
there asks for a password or token; an external Redis must have one).

`none` (FLEET_LOCAL_SANDBOX=none) is the operator's choice for their own jobs: the node then runs as the
fleet and shares its files. `auto`, the default, is bwrap, and no local node at all where bubblewrap is not
installed (the fleet says how to get it).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

BWRAP = "bwrap"
TMP = Path("/tmp")
SETPRIV = "setpriv"
NODE_USER = "trainfleet-node"  # USER and LOGNAME of a node that runs as local_node_uid
GPU_DEVICES = ("nvidia*", "dri")  # under /dev: what a node given GPUs needs besides bwrap's minimal /dev
MISSING = (
    "a local node runs the job's code on the fleet's machine, so it runs in a sandbox, and bubblewrap "
    "(`bwrap`) is not installed: install it (apt install bubblewrap, dnf install bubblewrap), or set "
    "FLEET_LOCAL_SANDBOX=none to run local nodes as the fleet itself (only for jobs you wrote)"
)


class SandboxUnavailable(Exception):
    """The local sandbox the settings ask for cannot be had on this machine (its message says how)."""


@dataclass(frozen=True)
class Sandbox:
    """The walls of a local node (see the module's notes): what it must not see, and who it runs as."""

    bwrap: str
    hidden: tuple[Path, ...]  # directories shown empty
    hidden_files: tuple[Path, ...]  # files shown as /dev/null
    uid: (
        int | None
    )  # its own uid and gid (the fleet runs as root), else None: the fleet's, in a user namespace
    setpriv: str | None = None

    @classmethod
    def of(cls, mode: str, uid: int, private: Iterable[Path]) -> Sandbox | None:
        """The sandbox `mode` (settings.local_sandbox) gives, hiding `private` (the fleet's home, runs
        directory, settings and secrets files, ...); None for `none`. SandboxUnavailable when bubblewrap (or,
        as root, setpriv) is missing."""
        if mode == "none":
            return None
        found = shutil.which(BWRAP)
        if found is None:
            raise SandboxUnavailable(MISSING)
        as_root = os.geteuid() == 0
        setpriv = shutil.which(SETPRIV) if as_root else None
        if as_root and setpriv is None:
            raise SandboxUnavailable(
                "the fleet runs as root, so a local node runs as a uid of its own, which `setpriv` "
                "(util-linux) sets: install util-linux, or set FLEET_LOCAL_SANDBOX=none (only for jobs you "
                "wrote)"
            )
        dirs: set[Path] = {TMP, Path.home()}
        files: set[Path] = set()
        runtime = Path(f"/run/user/{os.getuid()}")
        if runtime.is_dir():
            dirs.add(runtime)
        for path in private:
            absolute = path.expanduser().absolute()
            if absolute.is_dir():
                dirs.add(absolute)
            elif absolute.exists():
                files.add(absolute)
        return cls(found, _outermost(dirs), tuple(sorted(files)), uid if as_root else None, setpriv)

    def prepare(self, root: Path, shared: Iterable[Path]) -> None:
        """Make the node's root (with its home) and the shared directories it writes, owned by the node's uid
        when it has one of its own."""
        for path in (root, root / "home", *shared):
            path.mkdir(parents=True, exist_ok=True)
            if self.uid is not None:
                os.chown(path, self.uid, self.uid)
        root.chmod(0o700)

    def env(self, root: Path) -> dict[str, str]:
        """What a sandboxed node's environment says about where it lives: its home in its root, /tmp its own,
        its caches in its home (the fleet's HF_HOME or XDG_CACHE_HOME are out of its sight)."""
        home = root / "home"
        env = {
            "HOME": str(home),
            "TMPDIR": "/tmp",
            "XDG_CACHE_HOME": str(home / ".cache"),
            "HF_HOME": str(home / ".cache" / "huggingface"),
        }
        if self.uid is not None:
            env.update(USER=NODE_USER, LOGNAME=NODE_USER)
        return env

    def wrap(
        self, argv: list[str], root: Path, readable: Iterable[Path], writable: Iterable[Path], gpus: int
    ) -> list[str]:
        """`argv` run inside the sandbox: `readable` are shown again read-only where a hidden directory holds
        them (the node's Python), `root` and `writable` read-write; the GPU devices when it is given GPUs."""
        args = [
            self.bwrap,
            "--ro-bind", "/", "/",
            "--dev", "/dev",
            "--perms", "1777", "--tmpfs", "/dev/shm",  # Ray's object store, written as the node's own uid
            "--proc", "/proc",
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--new-session",
            "--hostname", "trainfleet-node",
        ]  # fmt: skip
        for path in self.hidden:  # /tmp its own, as any /tmp; the others empty, to be walked through only
            args += ["--perms", "1777" if path == TMP else "0711", "--tmpfs", str(path)]
        for path in self.hidden_files:
            if not self._is_hidden(path):  # (one in an emptied directory is out of sight already)
                args += ["--ro-bind", os.devnull, str(path)]
        made: set[Path] = set()
        for path in sorted({p.absolute() for p in readable}):
            if self._is_hidden(path) and path.exists():
                args += [*self._parents(path, made), "--ro-bind", str(path), str(path)]
        for path in sorted({root.absolute(), *(p.absolute() for p in writable)}):
            args += [*self._parents(path, made), "--bind", str(path), str(path)]
        if gpus:
            for pattern in GPU_DEVICES:
                for device in sorted(Path("/dev").glob(pattern)):
                    args += ["--dev-bind-try", str(device), str(device)]
        if self.uid is not None:
            assert self.setpriv is not None
            args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--", self.setpriv]
            args += [f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups", "--no-new-privs"]
        return [*args, "--", *argv]

    def _is_hidden(self, path: Path) -> bool:
        return any(path == hidden or hidden in path.parents for hidden in self.hidden)

    def _parents(self, path: Path, made: set[Path]) -> list[str]:
        """The directories between a hidden one and `path`, made in the empty view so that the node can walk
        through them (bubblewrap would copy their modes, and the fleet's home is 0700)."""
        args: list[str] = []
        for parent in reversed(path.parents):
            if parent in made or not self._is_hidden(parent) or parent in self.hidden:
                continue
            made.add(parent)
            args += ["--perms", "0711", "--dir", str(parent)]
        return args


def _outermost(paths: Iterable[Path]) -> tuple[Path, ...]:
    """`paths` without those inside another of them (an empty parent hides its children already)."""
    ordered = sorted(set(paths), key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in ordered:
        if path == Path("/"):
            continue
        if not any(k == path or k in path.parents for k in kept):
            kept.append(path)
    return tuple(sorted(kept))


def python_paths(python: Path) -> tuple[Path, ...]:
    """What running `python` reads: its virtual environment (when it is one: `<venv>/bin/python`), the base
    Python that venv names (pyvenv.cfg's `home`) and, for a base Python, its installation."""
    venv = python.parent.parent
    found = [venv]
    try:
        config = (venv / "pyvenv.cfg").read_text()
    except OSError:
        config = ""
    for line in config.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            found.append(Path(value.strip()).parent)  # <base>/bin -> <base>
    found.append(python.resolve().parent.parent)
    return tuple(dict.fromkeys(found))
