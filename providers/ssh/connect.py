"""One SSH connection to a pool machine: the host key checked, commands run, ports forwarded.

The client is paramiko: pure Python (no `ssh` binary, no ControlMaster sockets, no parsing of a user's
~/.ssh/config that the fleet never asked for), synchronous as the stages are, and it gives the two things a
stage needs from one authenticated transport: commands with their exit status, and `direct-tcpip` channels
for the node's Jobs API (providers.ssh.tunnel), so every word to the node goes over the encrypted channel
that the host key vouched for. asyncssh would do as well but would put an event loop inside each Celery
task; OpenSSH's binary would put a process per tunnel on the fleet's machine and its options in strings.

Host keys are checked, always: a machine's `host_key` pinned in the pools file, else the fleet's
known_hosts file (`ssh_known_hosts`; hashed entries work). An unknown host is refused with the command
that shows its key for the operator to check and add; a key that changed is refused naming both
fingerprints (it may be a reinstalled machine, or someone in the middle). No agent and no other keys are
tried: the machine's key file only, so what the fleet can reach is what the pools file says.
"""

from __future__ import annotations

import base64
import hashlib
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import paramiko

from core.errors import AuthFailed, ProviderError, ProviderUnavailable
from providers.ssh.pools import Machine

CONNECT_TIMEOUT_S = 10.0
MAX_OUTPUT = 256 * 1024


class MachineDown(ProviderUnavailable):
    """The machine did not answer on its SSH port (refused, timed out, no route)."""


class HostKeyRefused(ProviderError):
    """The machine's host key is unknown or not the one the fleet knows: no connection was made."""


def fingerprint(key: paramiko.PKey) -> str:
    """A key's SHA-256 fingerprint as OpenSSH prints it (`SHA256:...`)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _Checked(paramiko.MissingHostKeyPolicy):
    """Refuses every key the known keys do not hold (paramiko asks it only for a host it does not know)."""

    def __init__(self, machine: Machine, known_hosts: Path) -> None:
        self.machine, self.known_hosts = machine, known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        where = (
            f"pinned in the pools file as {self.machine.host_key.split()[0]}"
            if self.machine.host_key
            else (f"not in {self.known_hosts}")
        )
        scan = f"ssh-keyscan -p {self.machine.port} {self.machine.host}"
        raise HostKeyRefused(
            f"{self.machine.name}: its host key ({key.get_name()} {fingerprint(key)}) is {where}; check it "
            f"out of band (`{scan}`, then `ssh-keygen -lf` on the result) and add it"
        )


def _pinned(line: str) -> tuple[str, paramiko.PKey]:
    kind, blob = line.split()[:2]
    return kind, paramiko.PKey.from_type_string(kind, base64.b64decode(blob))


class Connection:
    """An open, authenticated connection to `machine`; a context manager that closes it."""

    def __init__(self, machine: Machine, known_hosts: Path, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.machine = machine
        client = paramiko.SSHClient()
        if machine.host_key:
            client.get_host_keys().add(machine.address, *_pinned(machine.host_key))
        elif known_hosts.is_file():
            client.get_host_keys().load(str(known_hosts))
        client.set_missing_host_key_policy(_Checked(machine, known_hosts))
        try:
            client.connect(
                machine.host,
                port=machine.port,
                username=machine.user,
                key_filename=str(machine.key),
                timeout=timeout_s,
                banner_timeout=timeout_s,
                auth_timeout=timeout_s,
                allow_agent=False,
                look_for_keys=False,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyRefused(
                f"{machine.name}: its host key changed: the fleet knows {exc.expected_key.get_name()} "
                f"{fingerprint(exc.expected_key)}, the machine showed {exc.key.get_name()} "
                f"{fingerprint(exc.key)}. A reinstalled machine, or someone between: check it, then "
                f"update {'the pools file' if machine.host_key else known_hosts}"
            ) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise AuthFailed(
                f"{machine.name}: {machine.user} was refused with {machine.key}: {exc}"
            ) from None
        except HostKeyRefused:  # an unknown host, refused by _Checked: the socket is open still
            client.close()
            raise
        except (OSError, paramiko.SSHException) as exc:
            client.close()
            raise MachineDown(f"{machine.name}: no SSH connection ({_why(exc)})") from None
        self.client = client

    @property
    def transport(self) -> paramiko.Transport:
        """The authenticated transport (for tunnels)."""
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise MachineDown(f"{self.machine.name}: the SSH connection closed")
        return transport

    def run(self, command: str, timeout_s: float = 60.0, stdin: bytes = b"") -> Completed:
        """Run `command` in the login user's shell, waiting up to `timeout_s` for it to end."""
        deadline = time.monotonic() + timeout_s
        try:
            channel = self.transport.open_session(timeout=timeout_s)
            channel.exec_command(command)
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()
            out, err = _Tail(), _Tail()
            while not (
                channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready()
            ):
                if time.monotonic() > deadline:
                    channel.close()
                    raise MachineDown(f"{self.machine.name}: {_head(command)} ran past {timeout_s:.0f} s")
                busy = False
                if channel.recv_ready():
                    out.add(channel.recv(65536))
                    busy = True
                if channel.recv_stderr_ready():
                    err.add(channel.recv_stderr(65536))
                    busy = True
                if not busy:
                    time.sleep(0.01)
            return Completed(channel.recv_exit_status(), out.text(), err.text())
        except (OSError, paramiko.SSHException) as exc:
            raise MachineDown(f"{self.machine.name}: {_head(command)} got no answer ({_why(exc)})") from None

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@dataclass(frozen=True)
class Completed:
    """A command's exit status and the tails of its output."""

    status: int
    stdout: str
    stderr: str


class _Tail:
    """The last `MAX_OUTPUT` bytes of a stream (a setup's pip log may be long)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        del self.data[:-MAX_OUTPUT]

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


def _head(command: str) -> str:
    return repr(command.split()[0]) if command.split() else "the command"


def _why(exc: BaseException) -> str:
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) and exc.errors:
        exc = next(iter(exc.errors.values()))  # the socket's own error, per address tried
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__
