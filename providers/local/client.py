"""Process control for Ray heads on this machine: start one detached, find its processes, stop them.

Each head has its own directory (meta.json, token, log), its own short Ray temp dir and its own ports.
Every process of a head carries that temp dir in its command line, which is how we find them all and
never touch anything else: `ray stop` would end every Ray process on the machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from providers.bootstrap import stop_notice_lines
from providers.local.environment import LOOPBACK_ONLY, SYSTEM_PATH, head_env, kept_env, software_key
from providers.local.ports import port_block
from providers.local.sandbox import Sandbox, python_paths
from providers.local.spawn import spawn_detached, wait_gone, write_private
from trainer.progress import NODE_ROOT_ENV

PORT_NAMES = (
    "port",
    "dashboard_port",
    "ray_client_server_port",
    "node_manager_port",
    "object_manager_port",
    "dashboard_agent_listen_port",
    "dashboard_agent_grpc_port",
    "metrics_export_port",
    "runtime_env_agent_port",
)
# A node that joins a head's cluster runs no GCS, dashboard or Ray client server of its own.
HEAD_ONLY_PORTS = ("port", "dashboard_port", "ray_client_server_port")
WORKER_PORT_NAMES = tuple(p for p in PORT_NAMES if p not in HEAD_ONLY_PORTS)


@dataclass
class HeadMeta:
    """What we know of one local Ray node (a head, or a node that joined one), in <node dir>/meta.json."""

    name: str
    temp_dir: str
    ports: dict[str, int]
    worker_ports: tuple[int, int]
    num_cpus: int
    num_gpus: int
    created_at: float
    pid: int = 0
    terminated_at: float | None = None
    head: str | None = None  # the head whose cluster this node joined; None for a head
    software: str = ""  # environment.software_key of what it runs ("" where none can be told)
    root: str = ""  # a sandboxed node's own root (FLEET_NODE_ROOT), kept after it; "" when it has none

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['dashboard_port']}"


# What a node's processes must not inherit from the fleet's environment: Ray's and the fleet's settings,
# and anything that would lead its Python to the fleet's packages instead of the node environment's own.
# (The fakes' stand-in for an image's setup uses it; a local node gets only providers.local.environment's.)
FLEET_ONLY_ENV = ("RAY_", "FLEET_", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX")
NODE_VENV = ".venv-node"  # `make node-env` builds it beside the fleet's .venv
AXOLOTL_VENV = ".venv-axolotl"  # `make axolotl-env`: axolotl's own pins, the fleet's Ray


def beside_fleet(venv: str) -> Path:
    """The Python of the environment `venv` that `make setup` builds beside the fleet's own."""
    return Path(sys.prefix).parent / venv / "bin" / "python"


def node_python(configured: Path | None = None) -> Path:
    """The Python that local nodes run: `configured` (settings.node_python), else the node environment that
    `make setup` builds beside the fleet's venv (<repo>/.venv-node), else the fleet's own Python."""
    if configured is not None:
        return configured
    beside = beside_fleet(NODE_VENV)
    return beside if beside.exists() else Path(sys.executable)


def axolotl_python(configured: Path | None = None) -> Path:
    """The Python of local nodes that run axolotl jobs: `configured` (settings.axolotl_python), else the
    environment `make axolotl-env` builds (<repo>/.venv-axolotl), else the builtin nodes' one (whose
    readiness check then says that axolotl is missing)."""
    if configured is not None:
        return configured
    beside = beside_fleet(AXOLOTL_VENV)
    return beside if beside.exists() else node_python()


def under_start_script(argv: list[str]) -> list[str]:
    """`ray start` argv run as a rented node's start script runs it, under its SIGTERM trap (providers.
    bootstrap.stop_notice_lines; the notice's path, FLEET_STOP_NOTICE, comes in the node's environment)."""
    script = "\n".join(["set -eu", *stop_notice_lines(), 'fleet_ray "$@"'])
    return ["/bin/sh", "-c", script, "sh", *argv]


class LocalHeads:
    """The local Ray heads under one directory. Their processes run `python` (a node environment's
    interpreter, whose bin/ holds its `ray`), not necessarily the fleet's."""

    def __init__(
        self,
        nodes_dir: Path,
        python: Path | None = None,
        sandbox: Sandbox | None = None,
        shared: tuple[Path, ...] = (),
        as_rented: bool = False,
    ) -> None:
        """`sandbox`: the walls of every head started here (None: none, a fake cloud's stand-in for a
        rented machine); `shared`: the directories its nodes may write besides their own root (the model
        cache). `as_rented` (a fake cloud's nodes): each node's Ray runs under the shell a rented node's
        start script runs it under (providers.bootstrap.stop_notice_lines), so that a SIGTERM to that
        shell (`notify`) is a container's stop, as a vendor sends it."""
        self.nodes_dir = nodes_dir
        self.python = python or node_python()
        self.sandbox = sandbox
        self.shared = shared
        self.as_rented = as_rented

    def node_dir(self, name: str) -> Path:
        return self.nodes_dir / name

    def read(self, name: str) -> HeadMeta | None:
        try:
            data = json.loads((self.node_dir(name) / "meta.json").read_text())
        except (OSError, ValueError):
            return None
        data["worker_ports"] = tuple(data["worker_ports"])
        return HeadMeta(**data)

    def _write(self, meta: HeadMeta) -> None:
        """Replace meta.json atomically. Two processes may stop one head at once (finalize, and the
        reaper confirming it): each writes its own temporary file, so neither moves the other's away."""
        path = self.node_dir(meta.name) / "meta.json"
        tmp = path.with_name(f".meta.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        tmp.write_text(json.dumps(asdict(meta)))
        tmp.replace(path)

    def log_tail(self, name: str, lines: int = 3) -> str:
        """The last lines of the head's own log (why it exited, usually)."""
        try:
            text = (self.node_dir(name) / "head.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def token(self, name: str) -> str:
        return (self.node_dir(name) / "token").read_text().strip()

    def names(self) -> list[str]:
        if not self.nodes_dir.exists():
            return []
        return sorted(p.name for p in self.nodes_dir.iterdir() if (p / "meta.json").exists())

    def start(
        self,
        name: str,
        num_cpus: int,
        num_gpus: int,
        env: dict[str, str],
        token: str | None = None,
        resources: Mapping[str, float] | None = None,
        python: Path | None = None,
        joinable: bool = False,
        fingerprint: bool = False,
        root: Path | None = None,
        readable: tuple[Path, ...] = (),
    ) -> HeadMeta:
        """Start a head for `name` in the background (returns once the process exists, not when ready).
        Its Ray token is `token` when given (a fake cloud passes the one its client chose), else fresh.
        `resources` are custom Ray resources the node offers (`ray start --resources`); `python` is the
        environment it runs in, when not this one's (a fake cloud's image). A head is loopback-only (see
        LOOPBACK_ONLY) unless `joinable`: other nodes may join its cluster (a fake cloud's head, which
        stands for a rented node listening on its own network). With `fingerprint`, its meta keeps the
        software_key of what it runs (the local provider's heads; a fake cloud's node has none, as a rented
        one). A sandboxed head's `root` (its FLEET_NODE_ROOT; default: `root` in its node directory) is
        where it writes; `readable` are paths it is shown read-only besides (a local model)."""
        token = token or secrets.token_hex(32)
        return self._launch(
            name,
            num_cpus,
            num_gpus,
            env,
            token,
            None,
            resources,
            python,
            joinable,
            fingerprint,
            root,
            readable,
        )

    def join(
        self,
        name: str,
        head_name: str,
        num_cpus: int,
        num_gpus: int,
        env: dict[str, str],
        token: str | None = None,
        resources: Mapping[str, float] | None = None,
        python: Path | None = None,
    ) -> HeadMeta:
        """Start node `name` as a worker of `head_name`'s cluster (`ray start --address`, the head's token):
        one more Ray node on this machine, with a temp dir and ports of its own, so it can be stopped (or
        fail) alone. Returns once the process exists; the head lists it once it has joined.
        `token` is the Ray token the node presents instead of the head's: a fake cloud passes the one its
        worker was given, so a wrong one really fails to join, as Ray's token auth refuses it."""
        head = self.read(head_name)
        if head is None or head.head is not None:
            raise ValueError(f"{head_name!r} is not a head started here")
        token = token or self.token(head_name)
        return self._launch(name, num_cpus, num_gpus, env, token, head, resources, python)

    def _launch(
        self,
        name: str,
        num_cpus: int,
        num_gpus: int,
        env: dict[str, str],
        token: str,
        head: HeadMeta | None,
        resources: Mapping[str, float] | None,
        python: Path | None = None,
        joinable: bool = True,
        fingerprint: bool = False,
        root: Path | None = None,
        readable: tuple[Path, ...] = (),
    ) -> HeadMeta:
        node_dir = self.node_dir(name)
        node_dir.mkdir(parents=True, exist_ok=True)
        token_path = write_private(node_dir / "token", token)
        root = root or node_dir / "root"
        # Unix socket paths are limited to ~107 bytes, so Ray's temp dir is short and under /tmp.
        digest = hashlib.sha256(str(node_dir.resolve()).encode()).hexdigest()[:12]
        # A sandboxed node writes its root, the shared cache and Ray's temp dir (its logs, seen from here).
        writable = (*self.shared, Path(f"/tmp/tfray-{digest}"))
        if self.sandbox is not None:  # the node reads its token inside its own root, as its own user
            self.sandbox.prepare(root, writable)
            token_path = write_private(root / ".ray-token", token, self.sandbox.uid)
        names = PORT_NAMES if head is None else WORKER_PORT_NAMES
        ports, worker_ports = port_block(len(names))
        meta = HeadMeta(
            name=name,
            temp_dir=f"/tmp/tfray-{digest}",
            ports=dict(zip(names, ports, strict=True)),
            worker_ports=worker_ports,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            created_at=time.time(),
            head=None if head is None else head.name,
            root=str(root) if self.sandbox is not None else "",
        )
        bin_dir = (python or self.python).parent  # not resolved: a venv's bin/python links the base Python
        if fingerprint:
            meta.software = software_key(python or self.python, {**kept_env(os.environ), **env}, num_gpus)
        if head is None:
            role = ["--head", "--dashboard-host=127.0.0.1", "--include-dashboard=true"]
        else:
            role = [f"--address=127.0.0.1:{head.ports['port']}"]
        argv = [
            str(bin_dir / "ray"),
            "start",
            *role,
            "--block",
            f"--temp-dir={meta.temp_dir}",
            f"--num-cpus={num_cpus}",
            f"--num-gpus={num_gpus}",
            "--node-ip-address=127.0.0.1",
            "--disable-usage-stats",
            f"--min-worker-port={meta.worker_ports[0]}",
            f"--max-worker-port={meta.worker_ports[1]}",
            *(f"--{k.replace('_', '-')}={v}" for k, v in meta.ports.items()),
            *([f"--resources={json.dumps(dict(resources))}"] if resources else []),
        ]
        own = {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token_path),
            "RAY_USAGE_STATS_ENABLED": "0",
            "PATH": os.pathsep.join((str(bin_dir), *SYSTEM_PATH)),
            "PYTHONUNBUFFERED": "1",
        }
        if not joinable:  # see LOOPBACK_ONLY: a head no node joins (Ray refuses a join in that mode)
            own.update(LOOPBACK_ONLY)
        argv = under_start_script(argv) if self.as_rented else argv
        if self.sandbox is not None:
            own.update(self.sandbox.env(root), **{NODE_ROOT_ENV: str(root)})
            argv = self.sandbox.wrap(
                argv, root, (*python_paths(python or self.python), *readable), writable, num_gpus
            )
        self._write(meta)  # intent first: a crash after the spawn still leaves a findable head
        meta.pid = spawn_detached(argv, head_env(os.environ, env, own), node_dir / "head.log")
        self._write(meta)
        return meta

    def processes(self, meta: HeadMeta) -> list[psutil.Process]:
        """Every live process of this head: those that name its temp dir (the `ray start` process, raylet,
        workers...) and everything they started, such as a Ray job's driver (`python -m trainer ...`),
        which runs in a session of its own and names no temp dir, but dies with the machine on a real node."""
        found: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter():
            try:
                # Its own read, not `proc.info`: process_iter's Process objects are shared by every thread
                # (a cache), so another thread's process_iter rewrites `info` with the attributes it asked.
                info = proc.as_dict(["cmdline", "status"])
                if info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                cmdline = " ".join(info["cmdline"] or [])
                if meta.temp_dir in cmdline:
                    found[proc.pid] = proc
                    found.update((child.pid, child) for child in proc.children(recursive=True))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return list(found.values())

    def head_alive(self, meta: HeadMeta) -> bool:
        """Whether the `ray start --block` process of this head still runs."""
        if not meta.pid:
            return False
        try:
            proc = psutil.Process(meta.pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return False
            if meta.temp_dir in " ".join(proc.cmdline()):
                return True
            # Just forked and not yet exec'd: still our process if it was born with the head, moments ago.
            return abs(proc.create_time() - meta.created_at) < 5 and time.time() - meta.created_at < 10
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False

    def notify(self, name: str, grace_s: float) -> bool:
        """A container's stop: SIGTERM to the node's first process alone (under `as_rented`, the shell whose
        trap tells the trainer), then up to `grace_s` for it to end; whether it did. `stop` kills the rest."""
        meta = self.read(name)
        if meta is None or not meta.pid:
            return False
        try:
            first = psutil.Process(meta.pid)
            first.send_signal(signal.SIGTERM)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return True
        return wait_gone([first], grace_s)

    def stop(self, name: str, grace_s: float = 0.5) -> None:
        """End every process of the head (SIGTERM, then SIGKILL after a grace period); idempotent. Most
        of a head's processes are gone 0.4 s after SIGTERM; its GCS, autoscaler monitor and `ray start`
        take 4 s more to end on their own, which only held up the run's end (as a rented node's power-off,
        a terminate gives nothing on the node a chance to save its state)."""
        meta = self.read(name)
        if meta is None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 3.0), (signal.SIGKILL, 3.0)):
            procs = self.processes(meta)  # scanned again each round: a dying head may still spawn
            if not procs:
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if meta.pid:
                    os.killpg(meta.pid, sig)
            for proc in procs:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.send_signal(sig)
            wait_gone(procs, wait)
        if not self.processes(meta):
            shutil.rmtree(meta.temp_dir, ignore_errors=True)
            (self.node_dir(name) / "token").unlink(missing_ok=True)  # a dead head's token is no use to anyone
            if meta.root:
                (Path(meta.root) / ".ray-token").unlink(missing_ok=True)
            meta.terminated_at = meta.terminated_at or time.time()
            self._write(meta)
