"""Ports for a Ray node on this machine: one block of its own, below the kernel's ephemeral range.

Not ports the kernel hands out (bind to port 0): those come from the ephemeral range, from which every
outgoing connection on the machine also takes its local port. A head binds its ports seconds after they
are chosen (`ray start` starts its processes one by one), and meanwhile any connection (a Ray worker's to
its GCS, a Redis client's) may take one: a head whose dashboard port went that way runs on without a
dashboard and is never ready (seen in CI with two Ray clusters at work). Below the ephemeral range only a
listener that chose the same port itself can take it.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
from pathlib import Path

LOWEST = 10_000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
WORKER_PORTS = 200  # the window for a node's Ray worker processes


def ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    return 32_768


def _free(port: int) -> bool:
    """Whether nothing holds `port` on loopback now (no listener, no connection lingering on it)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def port_block(count: int, workers: int = WORKER_PORTS) -> tuple[list[int], tuple[int, int]]:
    """`count` ports for a node's own servers and a window of `workers` ports for its worker processes,
    one block at a random place below the ephemeral range: every named port free now, and the window's
    ends and middle (Ray's raylet skips a worker port in use; a named port in use breaks its server)."""
    top = ephemeral_start()
    size = count + workers
    if top - size <= LOWEST:
        raise OSError(f"no room for {size} ports below the ephemeral range (it starts at {top})")
    for _ in range(100):
        start = LOWEST + secrets.randbelow(top - size - LOWEST)
        named = list(range(start, start + count))
        window = (start + count, start + size - 1)
        if all(map(_free, (*named, window[0], (window[0] + window[1]) // 2, window[1]))):
            return named, window
    raise OSError(f"no free block of {size} ports below {top}")
