"""TLS for the fakes: the node's own TLS front in front of a fake node, and a certificate for a fake's HTTPS.

A node created with FLEET_NODE_TLS_CERT / FLEET_NODE_TLS_KEY in its environment (a vast.ai instance) gets
what its start script gives a real one: its Jobs API only behind providers.onnode.tlsfront (the same code, run
here in a thread), with the certificate the fleet made for it; the key is not passed on into the node's
own environment, as the script unsets it. Its published port then speaks TLS and nothing else. With a
JupyterLab token too, the port its vendor publishes JupyterLab's at gets a front of its own, as on a real
node; the fake node runs no JupyterLab behind it, so the front ends TLS and then closes the connection, as
a real one does while JupyterLab is still being installed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import ipaddress
import ssl
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from providers.base import JUPYTER_PORT, JUPYTER_TOKEN_ENV
from providers.onnode.tlsfront import CERT_ENV, KEY_ENV, Front, from_env, server_context

if TYPE_CHECKING:
    from tests.fakes.nodes import Boot, NodeBackend


@dataclasses.dataclass
class _Opened:
    front: Front
    server: asyncio.Server
    port: int
    others: list[asyncio.Server] = dataclasses.field(default_factory=list)  # JupyterLab's front


class Fronted:
    """A node backend whose nodes with a TLS certificate in their environment publish their Jobs API only
    through a TLS front (the others, as `inner` runs them). `hellos` counts the handshakes at the fronts.
    `impostor` (a test's knob): the fronts of nodes started from then on present a certificate of their
    own instead of the one the fleet made and pinned, as something else answering at a node's address
    would."""

    def __init__(self, inner: NodeBackend) -> None:
        self.inner = inner
        self.hellos = Hellos()
        self.impostor = False
        self._fronts: dict[str, _Opened] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, daemon=True, name="tls-fronts").start()
            return self._loop

    def start(self, name: str, boot: Boot) -> None:
        """Start the node; with a certificate, its TLS front first (which refuses until the node is up)."""
        self._close(name)
        cert, key = boot.env.get(CERT_ENV), boot.env.get(KEY_ENV)
        if cert and key:
            context = self.hellos.watch(server_context(*self._certificate(from_env(cert), from_env(key))))
            front = Front(None)
            server = self._serve(front, context, 0)
            opened = _Opened(front, server, int(server.sockets[0].getsockname()[1]))
            if boot.env.get(JUPYTER_TOKEN_ENV) and JUPYTER_PORT in boot.ports:
                opened.others.append(self._serve(Front(None), context, boot.ports[JUPYTER_PORT]))
            with self._lock:
                self._fronts[name] = opened
            env = {k: v for k, v in boot.env.items() if k not in (CERT_ENV, KEY_ENV)}
            boot = dataclasses.replace(boot, env=env)
        self.inner.start(name, boot)

    def _certificate(self, cert: str, key: str) -> tuple[str, str]:
        """The certificate and key a node's front presents: the fleet's, or an impostor's own."""
        if not self.impostor:
            return cert, key
        with tempfile.TemporaryDirectory(prefix="impostor-") as folder:
            files = localhost_cert(Path(folder))
            return files[0].read_text(), files[1].read_text()

    def _serve(self, front: Front, context: ssl.SSLContext, port: int) -> asyncio.Server:
        """`front` listening with TLS on 127.0.0.1:`port` (0: any free one), in the fronts' loop."""
        opening = asyncio.start_server(front.connection, "127.0.0.1", port, ssl=context)
        return asyncio.run_coroutine_threadsafe(opening, self._running_loop()).result(10)

    def ready_port(self, name: str, token: str | None) -> int | None:
        """The TLS front's port once the node's own is up (which the front then forwards to)."""
        port = self.inner.ready_port(name, token)
        with self._lock:
            opened = self._fronts.get(name)
        if opened is None or port is None:
            return port
        opened.front.inner_port = port
        return opened.port

    def _close(self, name: str) -> None:
        with self._lock:
            opened = self._fronts.pop(name, None)
        if opened is not None and self._loop is not None:
            for server in (opened.server, *opened.others):
                self._loop.call_soon_threadsafe(server.close)

    def stop(self, name: str, notice_s: float = 0.0) -> None:
        """Stop the node (`notice_s`: NodeBackend.stop) and its front."""
        self.inner.stop(name, notice_s)
        self._close(name)

    def stop_all(self) -> None:
        """Stop every node and front."""
        with self._lock:
            names = list(self._fronts)
        for name in names:
            self._close(name)
        self.inner.stop_all()

    def __contains__(self, name: object) -> bool:
        return name in self.inner  # type: ignore[operator]

    def __getattr__(self, attribute: str) -> object:
        """What else a test reads of the backend (`heads`, `roots`...)."""
        return getattr(self.inner, attribute)


LOCAL_NAMES = ("localhost", "127.0.0.1")


def localhost_cert(folder: Path, names: tuple[str, ...] = LOCAL_NAMES) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost (or `names`: host names and addresses) and its
    key, written under `folder`: a fake's own HTTPS, which a test trusts by naming the certificate as its
    authority."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trainfleet test fake")])
    now = datetime.datetime.now(datetime.UTC)
    sans = [_san(n) for n in names]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = folder / "fake-tls.crt", folder / "fake-tls.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_file.chmod(0o600)
    return cert_file, key_file


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


class Hellos:
    """When each TLS handshake began at a fake's server (the client's hello, whether the handshake then
    succeeds or not): a test times what the fleet did after its first failed handshake by it."""

    def __init__(self) -> None:
        self._times: list[float] = []
        self._lock = threading.Lock()

    def watch(self, context: ssl.SSLContext) -> ssl.SSLContext:
        """`context`, counting the handshakes it serves here."""
        context.sni_callback = self._hello
        return context

    def _hello(self, _conn: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: ssl.SSLContext) -> None:
        with self._lock:
            self._times.append(time.time())

    @property
    def times(self) -> list[float]:
        with self._lock:
            return list(self._times)
