"""What a rented node runs when it starts: its failsafe, a Ray head with token auth, its Jobs API on port
8265 (or, for a cluster's node k > 0, a Ray node that joins the head), then the user's `entry` if the
section has one. Runs keep their files under FLEET_NODE_ROOT. Built from
argv lists and quoted with shlex; the only values that vary are ports and the entry, and the token is read
from the environment, never inlined.
"""

from __future__ import annotations

import ast
import base64
import functools
import inspect
import shlex
import zlib

from jobs.sections import ProviderName
from providers import failsafe
from trainer.config import NODE_ROOT_ENV

JOBS_PORT = 8265  # the Ray dashboard / Jobs API inside the node, published by the provider
TOKEN_ENV = "FLEET_RAY_TOKEN"  # the node's Ray token arrives in this environment variable
DEFAULT_NODE_ROOT = "/workspace/trainfleet"  # runs, the model cache and outputs on a rented node
HEAD_ADDRESS_ENV = failsafe.HEAD_ENV  # a worker node joins the Ray head at this host:port
GCS_PORT = 6379  # the head's Ray GCS (Ray's default), where worker nodes join
JOIN_RETRY_S = 5


def head_argv() -> list[str]:
    """`ray start` for the node's head (it blocks, so the container lives as long as the head)."""
    return [
        "ray",
        "start",
        "--head",
        "--block",
        "--dashboard-host=0.0.0.0",
        f"--dashboard-port={JOBS_PORT}",
        "--disable-usage-stats",
    ]


@functools.cache
def packed_failsafe() -> str:
    """providers.failsafe without its docstrings and comments, compressed and in base64: the start script
    travels in a field of the vendor's create call (vast.ai's `onstart`, RunPod's `dockerArgs`), so it is
    kept to a few kilobytes."""
    tree = ast.parse(inspect.getsource(failsafe))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and _is_docstring(body[0]):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return base64.b64encode(zlib.compress(ast.unparse(tree).encode(), 9)).decode()


def _is_docstring(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def failsafe_argv(vendor: ProviderName) -> list[str]:
    """The node's failsafe for a node of `vendor`, as argv (`python3 -c`, standard library only)."""
    loader = f'import base64,zlib;exec(zlib.decompress(base64.b64decode("{packed_failsafe()}")))'
    return ["python3", "-c", loader, vendor.value]


def failsafe_env(deadline_s: int | None, heartbeat_timeout_s: float | None) -> dict[str, str]:
    """What arms the failsafe in the node's environment: its maximum lifetime and how long it waits for
    the fleet's heartbeat (neither: it exits at once)."""
    env = {}
    if deadline_s is not None:
        env[failsafe.DEADLINE_ENV] = str(deadline_s)
    if heartbeat_timeout_s is not None:
        env[failsafe.HEARTBEAT_ENV] = f"{heartbeat_timeout_s:g}"
    return env


def worker_argv() -> list[str]:
    """`ray start` for a node that joins the head at $FLEET_RAY_HEAD_ADDRESS (appended by the script)."""
    return ["ray", "start", "--block", "--disable-usage-stats"]


def start_script(
    entry: str | None,
    vendor: ProviderName | None = None,
    worker: bool = False,
    private_host: str | None = None,
) -> str:
    """A POSIX shell script: the failsafe of a `vendor` node in the background (first, so that a node
    whose start goes wrong later goes too), token auth on, the node's root directory for runs
    (FLEET_NODE_ROOT, unless the section's env names another), the user's entry (split with shlex, run as
    argv, in the background), then Ray in the foreground: the head, or for a `worker` node a `ray start
    --address` that joins the head at $FLEET_RAY_HEAD_ADDRESS, tried again every few seconds while the
    head is not up yet (or restarts). `private_host` (a constant of the provider's, such as
    `$RUNPOD_POD_ID.runpod.internal`) is this node's name on the private network: Ray then advertises
    that address, which the cluster's other nodes can reach, instead of the one it would guess."""
    lines = ["set -eu"]
    if vendor is not None:
        lines.append(shlex.join(failsafe_argv(vendor)) + " &")
    lines += [
        f'export RAY_AUTH_MODE=token RAY_AUTH_TOKEN="${TOKEN_ENV}"',
        f'export {NODE_ROOT_ENV}="${{{NODE_ROOT_ENV}:-{DEFAULT_NODE_ROOT}}}"',
        f'mkdir -p "${NODE_ROOT_ENV}"',
    ]
    node_ip = ""
    if private_host:
        lines.append(f'NODE_IP="$(getent hosts "{private_host}" | awk \'{{print $1; exit}}\')" || NODE_IP=""')
        node_ip = ' ${NODE_IP:+"--node-ip-address=$NODE_IP"}'
    if entry:
        lines.append(shlex.join(shlex.split(entry)) + " &")
    if worker:
        join = shlex.join(worker_argv()) + f' --address="${HEAD_ADDRESS_ENV}"' + node_ip
        lines.append(f"while true; do {join} || true; sleep {JOIN_RETRY_S}; done")
    else:
        lines.append("exec " + shlex.join(head_argv()) + node_ip)
    return "\n".join(lines)


def container_command(
    entry: str | None,
    vendor: ProviderName | None = None,
    worker: bool = False,
    private_host: str | None = None,
) -> list[str]:
    """The container's command as argv (`sh -c SCRIPT`)."""
    return ["sh", "-c", start_script(entry, vendor, worker, private_host)]
