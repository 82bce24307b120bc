"""`providers.node.reach` says why a node's head does not answer, from what the call met on the wire: local
servers (TLS with the fakes' certificates, plain TCP) standing for a node, its front and RunPod's proxy.

The certificate causes are permanent (provision gives up on them soon); the others are a booting node's."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from core.errors import Unreachable
from providers.base import NodeEndpoint, Unanswered
from providers.node import reach
from tests.fakes.nodes import unused_port
from tests.fakes.tls import localhost_cert

pytestmark = pytest.mark.integration


class _Version(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: Any) -> None:
        """Silent."""


class _BadGateway(_Version):
    status = 502


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler], cert: tuple[Path, Path] | None) -> Iterator[int]:
    """An HTTP server on 127.0.0.1 (TLS with `cert`, else plain), in a thread; yields its port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if cert is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*cert)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def hanging_up(cert: tuple[Path, Path]) -> Iterator[int]:
    """A port that ends TLS with `cert` and then closes each connection at once, as a node's TLS front does
    while its node is not up."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*cert)
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                context.wrap_socket(conn, server_side=True).close()
            except OSError:
                conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        listener.close()


def probe(port: int, pin: Path | None = None, ca: Path | None = None) -> Unanswered | None:
    url = f"https://127.0.0.1:{port}"
    return reach(NodeEndpoint(url, url, {"Authorization": "Bearer secret-token"}, pin, ca), {}, timeout_s=5)


@pytest.fixture
def certs(tmp_path: Path) -> Callable[..., tuple[Path, Path]]:
    return lambda label, *names: localhost_cert(tmp_path / label, *((names,) if names else ()))


def test_an_answer_is_none_and_every_certificate_failure_is_named_and_permanent(
    certs: Callable[..., tuple[Path, Path]],
) -> None:
    own, other = certs("own"), certs("other")
    elsewhere = certs("elsewhere", "proxy.elsewhere.test")
    with serving(_Version, own) as port:
        assert probe(port, ca=own[0]) is None and probe(port, pin=own[0]) is None
        untrusted = probe(port, ca=other[0])  # RunPod's proxy, signed by an authority not trusted for it
        impostor = probe(port, pin=other[0])  # a vast.ai node's address, another certificate than the pin
    with serving(_Version, elsewhere) as port:
        misnamed = probe(port, ca=elsewhere[0])  # a trusted certificate, for another name
    assert untrusted is not None and untrusted.cause == Unreachable.CERTIFICATE
    assert untrusted.detail == "certificate verify failed: self-signed certificate"
    assert impostor is not None and impostor.cause == Unreachable.PIN
    assert "not the certificate pinned for the node" in impostor.detail
    assert misnamed is not None and misnamed.cause == Unreachable.HOSTNAME
    assert "IP address mismatch, certificate is not valid for '127.0.0.1'" in misnamed.detail
    for said in (untrusted, impostor, misnamed):
        assert said.cause.permanent and said.endpoint.startswith("https://127.0.0.1:")
        assert "secret-token" not in str(said)


def test_a_booting_nodes_causes_are_named_and_waited_out(certs: Callable[..., tuple[Path, Path]]) -> None:
    own = certs("own")
    refused = probe(unused_port(), pin=own[0])
    with hanging_up(own) as port:
        closed = probe(port, pin=own[0])
    with serving(_BadGateway, own) as port:
        gateway = probe(port, ca=own[0])
    with serving(_Version, None) as port:  # not TLS on that port
        plain = probe(port, pin=own[0])
    assert refused is not None and refused.cause == Unreachable.REFUSED, refused
    assert "Connection refused" in refused.detail
    assert closed is not None and closed.cause == Unreachable.CLOSED, closed
    assert gateway is not None and gateway.cause == Unreachable.HTTP, gateway
    assert gateway.detail == "HTTP 502 Bad Gateway"
    assert plain is not None and plain.cause == Unreachable.TLS and "WRONG_VERSION_NUMBER" in plain.detail
    assert not any(said.cause.permanent for said in (refused, closed, gateway, plain))
