"""A Ray node on a pool machine, started and stopped over SSH.

What runs there is a rented node's start script (providers.bootstrap.start_script): token auth, the node's
software set up by the same program (providers.onnode.nodesetup: what the machine's python3 lacks of the
fleet's pins goes into a venv in the user's home, once, under a lock), its root (the node's own
directory, where its runs keep their files), then Ray in the foreground under the shell that turns SIGTERM
into the trainer's stop notice. Only the head's argv differs: a pool machine is someone's computer, not a
container of its own, so every port of Ray's is chosen free on the machine (providers.local.ports, run
there) and the head listens on the machine's loopback only (the Jobs API is reached through the SSH
tunnel), in a temp dir of its own.

The node's environment (its Ray token, the credentials it needs) goes to the machine on the channel's
stdin into a file only the user can read, which the node's shell reads and deletes before anything else
runs: never on a command line, which every user of the machine can see. The node runs in a session of
its own (setsid), outliving the SSH connection; stopping it ends that session's processes and any of
Ray's that left it (found by the node's temp dir), then removes the node's files.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import shlex
import time

from pydantic import BaseModel, ConfigDict

from core.errors import NodeError, ProvisioningFailed
from providers import bootstrap
from providers.local import ports
from providers.local.client import PORT_NAMES, WORKER_PORT_NAMES
from providers.local.environment import LOOPBACK_ONLY
from providers.onnode import failsafe
from providers.ssh.connect import Connection
from trainer import stopnotice
from trainer.progress import NODE_ROOT_ENV

NODES = ".trainfleet/nodes"
"""Each node's own files (its log, its shell's pid), under the login user's home."""
STOP_WAIT_S = 20.0


class PoolNode(BaseModel):
    """One node on a pool machine, as the fleet finds it again: its files, Ray's ports and temp dir, and
    the session its shell leads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance: str
    machine: str
    home: str
    temp_dir: str
    ports: dict[str, int]
    worker_ports: tuple[int, int]
    session: int

    @property
    def head(self) -> bool:
        """Whether it is a head (it serves the Jobs API), not a node that joined one."""
        return "dashboard_port" in self.ports

    @property
    def dashboard_port(self) -> int:
        """The head's Jobs API port, on the machine's loopback."""
        return self.ports["dashboard_port"]

    @property
    def gcs_port(self) -> int:
        """The head's GCS port, where the cluster's other nodes join."""
        return self.ports["port"]


def ray_argv(node: PoolNode, gpus: int, node_ip: str, head: bool) -> list[str]:
    """`ray start` for a node on a pool machine: its own ports and temp dir, `gpus` GPUs, advertising
    `node_ip`; a head's dashboard (the Jobs API) on the machine's loopback."""
    role = ["--head", "--dashboard-host=127.0.0.1", "--include-dashboard=true"] if head else []
    return [
        "ray",
        "start",
        *role,
        "--block",
        f"--node-ip-address={node_ip}",
        f"--temp-dir={node.temp_dir}",
        f"--num-gpus={gpus}",
        "--disable-usage-stats",
        f"--min-worker-port={node.worker_ports[0]}",
        f"--max-worker-port={node.worker_ports[1]}",
        *(f"--{k.replace('_', '-')}={v}" for k, v in node.ports.items()),
    ]


def _choose_ports(ssh: Connection, head: bool) -> tuple[dict[str, int], tuple[int, int]]:
    """A free block of ports on the machine (providers.local.ports, run there with its python3); a node
    that joins a head runs no GCS, dashboard or Ray client server of its own."""
    names = PORT_NAMES if head else WORKER_PORT_NAMES
    program = inspect.getsource(ports) + f"\nimport json\nprint(json.dumps(port_block({len(names)})))\n"
    done = ssh.run("python3 -", stdin=program.encode(), timeout_s=30)
    if done.status != 0:
        raise ProvisioningFailed(f"{ssh.machine.name}: python3 could not choose ports: {done.stderr[-500:]}")
    named, window = json.loads(done.stdout)
    return dict(zip(names, named, strict=True)), (window[0], window[1])


def start_node(
    ssh: Connection,
    instance: str,
    env: dict[str, str],
    gpus: int = 0,
    join: str | None = None,
    node_ip: str | None = None,
) -> PoolNode:
    """Start `instance`'s Ray node on the connection's machine with `env` (its token among them): a head,
    or given `join` (the head's `ip:port`) a node that joins it. `node_ip`: the address the cluster's other
    machines reach this one at; none for a head alone, which then listens on loopback only."""
    home_done = ssh.run('printf %s "$HOME"', timeout_s=15)
    if home_done.status != 0 or not home_done.stdout.startswith("/"):
        raise ProvisioningFailed(f"{ssh.machine.name}: the login user has no home directory")
    home = f"{home_done.stdout}/{NODES}/{instance}"
    node_ports, worker_ports = _choose_ports(ssh, head=join is None)
    digest = hashlib.sha256(f"{ssh.machine.name}/{instance}".encode()).hexdigest()[:10]
    node = PoolNode(
        instance=instance,
        machine=ssh.machine.name,
        home=home,
        temp_dir=f"/tmp/tfpool-{digest}",  # short: Ray's socket paths are in it
        ports=node_ports,
        worker_ports=worker_ports,
        session=0,
    )
    argv = ray_argv(node, gpus, node_ip or "127.0.0.1", head=join is None)
    own = {
        stopnotice.NOTICE_ENV: f"{home}/stop-notice",  # the machine's /tmp is shared: the node's own notice
        NODE_ROOT_ENV: f"{home}/root",  # the runs' files, with the node's own: gone with it (unless kept)
        bootstrap.BOOTSTRAP_ENV: bootstrap.start_script(bootstrap.POOL, worker=join is not None, ray=argv),
        failsafe.RAY_TEMP_ENV: node.temp_dir,  # where its failsafe reads the dashboard's log of heartbeats
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONUNBUFFERED": "1",
    }
    if join is not None:
        own[bootstrap.HEAD_ADDRESS_ENV] = join
    if node_ip is None:
        own.update(LOOPBACK_ONLY)  # a head alone: every server of Ray's on the machine's loopback
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in {**env, **own}.items())
    return node.model_copy(update={"session": _launch(ssh, home, exports)})


def _launch(ssh: Connection, home: str, exports: str) -> int:
    """Write the node's environment (stdin, a 0600 file) and start its shell in a session of its own,
    outliving the connection; that session's id."""
    q = shlex.quote(home)
    made = ssh.run(f"umask 077 && mkdir -p {q}/root && cat > {q}/env", stdin=exports.encode(), timeout_s=30)
    if made.status != 0:
        raise ProvisioningFailed(f"{ssh.machine.name}: cannot write {home}: {made.stderr[-500:]}")
    shell = f'echo $$ > pid; . ./env; rm -f ./env; exec sh -c "${bootstrap.BOOTSTRAP_ENV}"'
    started = ssh.run(
        f"cd {q} && rm -f pid && (setsid sh -c {shlex.quote(shell)} > node.log 2>&1 < /dev/null &)"
        f" && for i in $(seq 50); do [ -s pid ] && break; sleep 0.1; done; cat pid",
        timeout_s=30,
    )
    if started.status != 0 or not started.stdout.strip().isdigit():
        raise ProvisioningFailed(f"{ssh.machine.name}: the node did not start: {started.stderr[-500:]}")
    return int(started.stdout.strip())


def _left(node: PoolNode) -> str:
    """A command that prints the pids of what is left of `node` (its session's, or Ray's in its temp dir;
    the pattern `[/]tmp/...` finds the temp dir but not this command's own shell, whose line holds it)."""
    pattern = shlex.quote(f"[{node.temp_dir[0]}]{node.temp_dir[1:]}")
    return f'{{ pgrep -s {node.session}; pgrep -u "$(id -u)" -f {pattern}; }} | sort -u'


def alive(ssh: Connection, node: PoolNode) -> bool:
    """Whether the node's start shell, its session's leader, still runs: it ends when Ray does (what else
    of the node is left then, its failsafe among them, is stop's to end)."""
    return ssh.run(f"kill -0 {node.session}", timeout_s=15).status == 0


def running(ssh: Connection, node: PoolNode) -> bool:
    """Whether anything of `node` runs on the machine."""
    return bool(ssh.run(_left(node), timeout_s=15).stdout.split())


def log_tail(ssh: Connection, node: PoolNode, lines: int = 40) -> str:
    """The end of the node's log (its start script's and Ray's output)."""
    return ssh.run(f"tail -n {lines} {shlex.quote(node.home)}/node.log", timeout_s=15).stdout


def stop(ssh: Connection, node: PoolNode, keep_files: bool = False) -> None:
    """End every process of `node` (SIGTERM to each, then SIGKILL to what is left after STOP_WAIT_S) and,
    unless `keep_files`, remove its files and Ray's temp dir. Idempotent: a node already gone is removed
    again, harmlessly."""
    ssh.run(f"kill -TERM $({_left(node)}) 2>/dev/null; true", timeout_s=15)
    deadline = time.monotonic() + STOP_WAIT_S
    while running(ssh, node) and time.monotonic() < deadline:
        time.sleep(0.5)
    deadline = time.monotonic() + STOP_WAIT_S  # what is left, killed until none is (a shell's loop may fork)
    while running(ssh, node):
        if time.monotonic() > deadline:
            raise NodeError(f"{ssh.machine.name}: {node.instance} still runs after SIGKILL")
        ssh.run(f"kill -KILL $({_left(node)}) 2>/dev/null; true", timeout_s=15)
        time.sleep(0.2)
    if not keep_files:
        ssh.run(f"rm -rf {shlex.quote(node.home)} {shlex.quote(node.temp_dir)}", timeout_s=60)
