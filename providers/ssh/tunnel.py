"""A local port forwarded over an SSH connection to a port on the machine's loopback.

The node's Jobs API (the Ray dashboard) listens on the pool machine's 127.0.0.1 only; the fleet reaches it
through `Tunnel`: a listener on this machine's loopback whose every connection becomes a `direct-tcpip`
channel of the authenticated transport. Nothing of the node is exposed on the machine's network, and the
bytes travel encrypted under the host key the fleet checked. The tunnel lives as long as the connection
(a context manager closes both ends).
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
from collections.abc import Callable
from types import TracebackType

import paramiko

from providers.ssh.connect import Connection

CHUNK = 64 * 1024


class _QuietRefusals(logging.Filter):
    """paramiko logs, as an ERROR, every forwarded connection the machine refuses ("Secsh channel N open
    FAILED"): a node's Jobs API refuses until its head is up, and the readiness poll asks every few
    seconds. The tunnel drops such a connection, so its client sees the refusal; the log need not."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "open FAILED" not in record.getMessage()


logging.getLogger("paramiko.transport").addFilter(_QuietRefusals())


class Tunnel:
    """`127.0.0.1:<local_port>` here, forwarded to `127.0.0.1:<remote_port>` on the connection's machine."""

    def __init__(self, connection: Connection, remote_port: int) -> None:
        self.connection, self.remote_port = connection, remote_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.local_port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._accepting = threading.Thread(target=self._accept, name=f"tunnel:{remote_port}", daemon=True)
        self._accepting.start()

    @property
    def url(self) -> str:
        """The forwarded port as an http URL on this machine."""
        return f"http://127.0.0.1:{self.local_port}"

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                local, peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                channel = self.connection.transport.open_channel(
                    "direct-tcpip", ("127.0.0.1", self.remote_port), peer, timeout=10
                )
            except (OSError, paramiko.SSHException):  # the machine refused it: drop this connection
                local.close()
                continue
            threading.Thread(target=self._pump, args=(local, channel), daemon=True).start()

    def _pump(self, local: socket.socket, channel: paramiko.Channel) -> None:
        with contextlib.closing(local), contextlib.closing(channel):
            while not self._closed.is_set():
                ready, _, _ = select.select([local.fileno(), channel.fileno()], [], [], 0.2)
                if local.fileno() in ready and not _move(local.recv, channel.sendall):
                    return
                if channel.fileno() in ready and not _move(channel.recv, local.sendall):
                    return

    def close(self) -> None:
        """Stop listening and end every forwarded connection."""
        self._closed.set()
        self._listener.close()
        self._accepting.join(timeout=2)

    def __enter__(self) -> Tunnel:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _move(source: Callable[[int], bytes], sink: Callable[[bytes], object]) -> bool:
    """One read from `source` written whole to `sink`; False at the end of the stream or on an error."""
    try:
        data = source(CHUNK)
        if not data:
            return False
        sink(data)
        return True
    except OSError:
        return False
