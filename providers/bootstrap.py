"""What a rented node runs when it starts: a Ray head with token auth, its Jobs API on port 8265, then
the user's `entry` if the section has one. Runs keep their files under FLEET_NODE_ROOT. Built from argv
lists and quoted with shlex; the only values that vary are ports and the entry, and the token is read from
the environment, never inlined.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from trainer.config import NODE_ROOT_ENV

JOBS_PORT = 8265  # the Ray dashboard / Jobs API inside the node, published by the provider
TOKEN_ENV = "FLEET_RAY_TOKEN"  # the node's Ray token arrives in this environment variable
DEFAULT_NODE_ROOT = "/workspace/trainfleet"  # runs, the model cache and outputs on a rented node
DEADLINE_ENV = "FLEET_DEADLINE_S"  # seconds after its start at which a node gives itself back


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


def start_script(entry: str | None, on_deadline: Sequence[str] | None = None) -> str:
    """A POSIX shell script: token auth on, the node's root directory for runs (FLEET_NODE_ROOT, unless
    the section's env names another), a watchdog that runs `on_deadline` (argv) once FLEET_DEADLINE_S
    seconds have passed, if both are given, the user's entry (split with shlex, run as argv, in the
    background), then the head in the foreground."""
    lines = [
        "set -eu",
        f'export RAY_AUTH_MODE=token RAY_AUTH_TOKEN="${TOKEN_ENV}"',
        f'export {NODE_ROOT_ENV}="${{{NODE_ROOT_ENV}:-{DEFAULT_NODE_ROOT}}}"',
        f'mkdir -p "${NODE_ROOT_ENV}"',
    ]
    if on_deadline:
        lines.append(f'if [ -n "${{{DEADLINE_ENV}:-}}" ]; then')
        lines.append(f'  (sleep "${DEADLINE_ENV}" && {shlex.join(on_deadline)}) &')
        lines.append("fi")
    if entry:
        lines.append(shlex.join(shlex.split(entry)) + " &")
    lines.append("exec " + shlex.join(head_argv()))
    return "\n".join(lines)


def container_command(entry: str | None) -> list[str]:
    """The container's command as argv (`sh -c SCRIPT`)."""
    return ["sh", "-c", start_script(entry)]
