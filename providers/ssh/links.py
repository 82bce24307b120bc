"""The fleet's SSH connections to pool machines and the tunnels to their nodes' Jobs APIs, kept per process.

A stage polls a node every few seconds; a new SSH handshake each time would cost more than the poll. So a
process keeps one connection per machine, and one tunnel per node port it talks to, and makes them again
when the machine closed them. A Celery worker forks its children after the fleet's modules are loaded:
what the parent held belongs to the parent (its sockets, its tunnels' threads), so a child starts afresh,
and leaves the parent's alone rather than closing sockets it shares with it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

from core.errors import ProviderError
from providers.ssh.connect import Connection
from providers.ssh.pools import Machine
from providers.ssh.tunnel import Tunnel


class Links:
    """Connections and tunnels of this process, by machine name (and the remote port a tunnel reaches)."""

    def __init__(self, known_hosts: Path) -> None:
        self.known_hosts = known_hosts
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._connections: dict[str, Connection] = {}
        self._tunnels: dict[tuple[str, int], Tunnel] = {}

    def _own(self) -> None:
        if os.getpid() != self._pid:  # a forked child: the parent's are not this process's to use or close
            self._pid, self._connections, self._tunnels = os.getpid(), {}, {}

    def connection(self, machine: Machine) -> Connection:
        """An open connection to `machine` (MachineDown, HostKeyRefused, AuthFailed: none could be made)."""
        with self._lock:
            self._own()
            held = self._connections.get(machine.name)
            if held is not None and held.machine == machine:
                try:
                    held.transport  # noqa: B018 - raises when the machine closed it
                    return held
                except ProviderError:
                    pass
            self.drop(machine.name)
            made = Connection(machine, self.known_hosts)
            self._connections[machine.name] = made
            return made

    def tunnel(self, machine: Machine, port: int) -> Tunnel:
        """A tunnel from this machine's loopback to `port` on `machine`'s, over the live connection."""
        with self._lock:
            connection = self.connection(machine)
            held = self._tunnels.get((machine.name, port))
            if held is not None and held.connection is connection:
                return held
            if held is not None:
                held.close()
            made = Tunnel(connection, port)
            self._tunnels[(machine.name, port)] = made
            return made

    def close_tunnel(self, machine: str, port: int) -> None:
        """Close the tunnel to `port` on `machine` (its node is stopped), if this process has one."""
        with self._lock:
            self._own()
            held = self._tunnels.pop((machine, port), None)
            if held is not None:
                held.close()

    def drop(self, machine: str) -> None:
        """Close this process's connection to `machine` and its tunnels (after an error on it)."""
        with self._lock:
            self._own()
            for key in [k for k in self._tunnels if k[0] == machine]:
                self._tunnels.pop(key).close()
            held = self._connections.pop(machine, None)
            if held is not None:
                with contextlib.suppress(Exception):
                    held.close()
