"""The fake RunPod's HTTPS proxy: RunPod publishes a pod's HTTP port at https://<podId>-<port>.proxy.runpod.net;
here it is https://127.0.0.1:<proxy port>/<podId>-<port>/..., with the fake's own certificate (a test
trusts it by naming it: FLEET_RUNPOD_PROXY_CA_FILE). Each request goes on to the pod's node as it came,
headers and body unchanged (the failsafe counts the fleet's User-Agent there), and its answer comes back.
"""

from __future__ import annotations

import http.client
import re
import ssl
import sys
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.fakes.serving import Served
from tests.fakes.tls import Hellos, localhost_cert

ROUTE = re.compile(r"^/(?P<pod>[a-z0-9]+)-(?P<port>\d{1,5})(?P<rest>/.*)?$")
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "upgrade", "host", "content-length"})

HANDSHAKE_TIMEOUT_S = 10.0

Target = Callable[[str, int], int | None]
"""(pod id, container port) -> the local port that serves it now, or None (no such pod, port not up)."""


class _Handler(BaseHTTPRequestHandler):
    server: _ProxyServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: without it, ~40 ms a kept-alive call

    def _forward(self) -> None:
        match = ROUTE.match(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        port = self.server.target(match["pod"], int(match["port"])) if match else None
        if match is None or port is None:
            self._answer(404, [], b"no such pod or port behind this proxy")
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        inner = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            inner.request(self.command, match["rest"] or "/", body=body, headers=headers)
            reply = inner.getresponse()
            data = reply.read()
        except OSError:
            self._answer(502, [], b"the pod did not answer")
            return
        finally:
            inner.close()
        kept = [(k, v) for k, v in reply.getheaders() if k.lower() not in HOP_BY_HOP]
        self._answer(reply.status, kept, data)

    def _answer(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _forward

    def log_message(self, format: str, *args: Any) -> None:
        """Silent."""


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, target: Target, context: ssl.SSLContext) -> None:
        self.target = target
        self.context = context
        super().__init__(("127.0.0.1", 0), _Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        """TLS in the connection's own thread, as a real proxy's front serves each client on its own: a
        client that never finishes its handshake holds up no other (nor this thread, past the timeout)."""
        request.settimeout(HANDSHAKE_TIMEOUT_S)
        with self.context.wrap_socket(request, server_side=True) as tls:
            tls.settimeout(None)
            super().finish_request(tls, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up, or one that did not trust the certificate, is not an error here."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class RunPodProxy(Served):
    """The proxy, served in a daemon thread: `url_template` is what the fleet's runpod_proxy_url is set to,
    `ca_file` the certificate it trusts for it. `hellos` counts the TLS handshakes it served."""

    def __init__(self, target: Target, folder: Path) -> None:
        self.port = 0
        self.target = target
        self.folder = folder
        self.ca_file, self._key_file = localhost_cert(folder)
        self.hellos = Hellos()
        self._context: ssl.SSLContext | None = None

    def new_server(self) -> ThreadingHTTPServer:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.ca_file, self._key_file)
        self._context = self.hellos.watch(context)
        return _ProxyServer(self.target, context)

    def present(self, *names: str) -> Path:
        """A test's knob: from now on the proxy presents a certificate for `names` only (self-signed, as a
        misconfigured proxy's would be); returns its file, for a test to trust as the proxy's authority."""
        cert, key = localhost_cert(self.folder / "presented", names)
        assert self._context is not None, "the proxy is not serving"
        self._context.load_cert_chain(cert, key)  # the handshakes from now on
        return cert

    @property
    def url_template(self) -> str:
        """The proxy URL of a pod's port, with {pod_id} and {port} left to fill in."""
        return self.url.replace("http://", "https://") + "/{pod_id}-{port}"

    def values(self) -> dict[str, Any]:
        """The same as `settings`, by field name (core.settings.Settings, providers.base.ProviderContext)."""
        return {"runpod_proxy_url": self.url_template, "runpod_proxy_ca_file": self.ca_file}

    def settings(self) -> dict[str, str]:
        """The fleet's settings (environment) that send it through this proxy and trust it."""
        return {"FLEET_RUNPOD_PROXY_URL": self.url_template, "FLEET_RUNPOD_PROXY_CA_FILE": str(self.ca_file)}
