"""On the node (stdlib only): the TLS front of its Jobs API and of its JupyterLab. The Ray dashboard (and
JupyterLab, on a node that runs it) listens on loopback only, and this listens on the published port, ends
TLS with the certificate the fleet made for this node (and pins), and passes the bytes through both ways
unchanged: the token, the User-Agent the failsafe counts as the fleet's heartbeat, the datasets and results
a Ray job carries, and JupyterLab's token and websockets all cross the internet encrypted.

Run by the start script (providers.bootstrap) as `python3 -c SOURCE LISTEN_PORT INNER_PORT [LISTEN_PORT
INNER_PORT ...]`, one pair per port it fronts, with the certificate and key in FLEET_NODE_TLS_CERT /
FLEET_NODE_TLS_KEY (PEM in base64, one line each, as a vendor's environment takes them: `env_value`); it
writes them to an owner-only directory for the ssl module, and the script unsets both before anything else
starts (JupyterLab, Ray), so neither the notebook's kernels nor a Ray job inherits the key.
"""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import sys
import tempfile
from collections.abc import Mapping

CERT_ENV = "FLEET_NODE_TLS_CERT"
KEY_ENV = "FLEET_NODE_TLS_KEY"
CHUNK = 1 << 16


def env_value(pem: str) -> str:
    """A PEM text as one line for the node's environment (base64); `from_env` reads it back."""
    return base64.b64encode(pem.encode()).decode()


def from_env(value: str) -> str:
    """The PEM text of an environment value made by `env_value`."""
    return base64.b64decode(value, validate=True).decode()


def server_context(cert_pem: str, key_pem: str) -> ssl.SSLContext:
    """A TLS 1.2+ server context with this node's certificate and key (written owner-only, then read)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="tlsfront-") as folder:  # mkdtemp: mode 700
        cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
        for path, text in ((cert, cert_pem), (key, key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
        context.load_cert_chain(cert, key)
    return context


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError, OSError):
        pass
    finally:
        writer.close()


class Front:
    """Passes each TLS connection to `inner_host:inner_port`. `inner_port` may be None (and set later, as
    a test's fake node does once its head is up): until then a connection is closed at once."""

    def __init__(self, inner_port: int | None, inner_host: str = "127.0.0.1") -> None:
        self.inner_port = inner_port
        self.inner_host = inner_host

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client: open the inner connection and pipe both ways until either side closes."""
        try:
            if self.inner_port is None:
                raise ConnectionRefusedError("nothing to forward to yet")
            inner = await asyncio.open_connection(self.inner_host, self.inner_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, inner[1]), _pipe(inner[0], writer))

    async def serve(self, context: ssl.SSLContext, host: str, port: int) -> None:
        """Listen on host:port with TLS until cancelled."""
        server = await asyncio.start_server(self.connection, host, port, ssl=context)
        async with server:
            await server.serve_forever()


def pairs(argv: list[str]) -> list[tuple[int, int]]:
    """`LISTEN INNER [LISTEN INNER ...]` as (listen, inner) ports; ValueError unless whole pairs of
    numbers. (No `zip(strict=)`: a node's python3 may be 3.9.)"""
    ports = [int(word) for word in argv]
    if not ports or len(ports) % 2:
        raise ValueError(f"expected LISTEN_PORT INNER_PORT pairs, got {argv}")
    return [(ports[i], ports[i + 1]) for i in range(0, len(ports), 2)]


async def serve_all(context: ssl.SSLContext, fronted: list[tuple[int, int]]) -> None:
    """Each (listen, inner) pair's front on all interfaces, until cancelled."""
    await asyncio.gather(*(Front(inner).serve(context, "0.0.0.0", listen) for listen, inner in fronted))


def main(argv: list[str], env: Mapping[str, str]) -> int:
    """`LISTEN_PORT INNER_PORT [...]`: serve until killed (the container's end ends it)."""
    try:
        fronted = pairs(argv)
        context = server_context(from_env(env[CERT_ENV]), from_env(env[KEY_ENV]))
    except (ValueError, KeyError, ssl.SSLError) as exc:
        print(f"tlsfront: off: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 2
    asyncio.run(serve_all(context, fronted))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], os.environ))
