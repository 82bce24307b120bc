"""What a rented node runs when it starts: a Ray head with token auth, its Jobs API on port 8265, then
the user's `entry` if the section has one. Built from argv lists and quoted with shlex; the only
values that vary are ports and the entry, and the token is read from the environment, never inlined.
"""

from __future__ import annotations

import shlex

JOBS_PORT = 8265  # the Ray dashboard / Jobs API inside the node, published by the provider
TOKEN_ENV = "FLEET_RAY_TOKEN"  # the node's Ray token arrives in this environment variable


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


def start_script(entry: str | None) -> str:
    """A POSIX shell script: token auth on, the user's entry (split with shlex, run as argv, in the
    background), then the head in the foreground."""
    lines = [
        "set -eu",
        f'export RAY_AUTH_MODE=token RAY_AUTH_TOKEN="${TOKEN_ENV}"',
    ]
    if entry:
        lines.append(shlex.join(shlex.split(entry)) + " &")
    lines.append("exec " + shlex.join(head_argv()))
    return "\n".join(lines)


def container_command(entry: str | None) -> list[str]:
    """The container's command as argv (`sh -c SCRIPT`)."""
    return ["sh", "-c", start_script(entry)]
