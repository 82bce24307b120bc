"""A pool node's failsafe (ssh): the machine is the operator's, with no vendor to ask, so when the fleet is
gone (no heartbeat) or the node's lifetime is over, the node ends its own processes and the GPUs are free
again. The fleet, back, finds the node ended and gives the machine back to its pool.

On a pool node this runs after the failsafe's own code, in its namespace (providers.bootstrap's loader for
`ssh`), so the rented nodes' start script, where every byte counts, carries none of it. Standard library
only, as the failsafe; the import of the failsafe below is for the fleet's checks and is left out there.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Mapping

from providers.onnode.failsafe import GIVE_BACK, POLL_S, RAY_TEMP_ENV, GiveBackRefused, main

STOP_GRACE_S = 10.0  # SIGTERM, then SIGKILL to what is left


def node_processes(session: int, temp_dir: str | None) -> list[int]:
    """This user's live processes in the node's session, or whose command line names its Ray temp dir (one
    of Ray's that left the session); never this one."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != os.getuid():
                continue
            with open(f"/proc/{entry}/stat", "rb") as stat:
                if stat.read().rpartition(b")")[2].split()[0] == b"Z":
                    continue  # ended, not yet reaped by its parent
            if os.getsid(int(entry)) == session:
                found.append(int(entry))
            elif temp_dir:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    if temp_dir.encode() in cmdline.read():
                        found.append(int(entry))
        except OSError:  # gone meanwhile
            continue
    return found


def stop_pool_node(env: Mapping[str, str]) -> Callable[[], None]:
    """End every process of this node: SIGTERM, then SIGKILL after STOP_GRACE_S (its start shell too, so
    a node still setting up starts nothing after)."""
    session, temp_dir = os.getsid(0), env.get(RAY_TEMP_ENV)

    def stop() -> None:
        for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
            for pid in node_processes(session, temp_dir):
                try:
                    os.kill(pid, sig)
                except OSError:
                    continue
            deadline = time.monotonic() + wait
            while node_processes(session, temp_dir) and time.monotonic() < deadline:
                time.sleep(POLL_S / 4)
        left = node_processes(session, temp_dir)
        if left:
            raise GiveBackRefused(f"{len(left)} of the node's processes outlived SIGKILL")

    return stop


if __name__ == "failsafe":  # on a pool node, after the failsafe's code in its namespace
    GIVE_BACK["ssh"] = stop_pool_node
    sys.exit(main(sys.argv[1:], os.environ))
