"""HTTP plumbing for the fake Hub: streamed request bodies, file replies with Range and bandwidth caps.

`base.py`'s server reads every body into memory and answers JSON only. The Hub needs more: LFS uploads
of any size (sent with Content-Length or chunked), file downloads streamed from disk, HEAD, and two
bandwidth caps on the files it sends. The throttle (`Reply.rate_bps`) paces one response: each connection
is served by its own thread, so each download gets the full rate, as from a CDN edge that caps a
connection. The link (`Reply.link`, a `Link`) is one budget that every response drawing on it shares, as
the node's network link is: N connections under a link of L bytes/s get L together, not N x L.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import BufferedIOBase
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

_BODY_CHUNK = 1024 * 1024
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
_LINE_LIMIT = 65537
# Throttled files go out in pieces of ~1/50 s worth of bytes, so the pacing is smooth and cheap.
_MIN_PIECE, _MAX_PIECE, _PIECES_PER_S = 4 * 1024, 256 * 1024, 50


@dataclass
class HubRequest:
    """One request: path split into unquoted segments; the body is read on demand, once."""

    method: str
    segments: list[str]
    query: dict[str, str]
    headers: dict[str, str]
    rfile: BufferedIOBase
    consumed: bool = False

    @classmethod
    def read(cls, handler: BaseHTTPRequestHandler) -> HubRequest:
        """Parse the request line and headers (not the body)."""
        split = urlsplit(handler.path)
        return cls(
            method=handler.command,
            segments=[unquote(s) for s in split.path.split("/")[1:]],
            query={k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()},
            headers={k.lower(): v for k, v in handler.headers.items()},
            rfile=handler.rfile,
        )

    @property
    def base_url(self) -> str:
        """The URL the client reached us at, for links we hand back (commit URLs, LFS upload URLs)."""
        return f"http://{self.headers.get('host', '127.0.0.1')}"

    def chunks(self) -> Iterator[bytes]:
        """The body, piece by piece (Content-Length or chunked transfer encoding)."""
        if self.consumed:
            return
        self.consumed = True
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            yield from self._dechunk()
            return
        left = int(self.headers.get("content-length") or 0)
        while left > 0:
            piece = self.rfile.read(min(_BODY_CHUNK, left))
            if not piece:
                raise ConnectionError("client closed the connection mid-body")
            left -= len(piece)
            yield piece

    def _dechunk(self) -> Iterator[bytes]:
        while True:
            size = int(self.rfile.readline(_LINE_LIMIT).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline(_LINE_LIMIT) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return
            left = size
            while left > 0:
                piece = self.rfile.read(min(_BODY_CHUNK, left))
                if not piece:
                    raise ConnectionError("client closed the connection mid-chunk")
                left -= len(piece)
                yield piece
            self.rfile.readline(_LINE_LIMIT)  # the CRLF after each chunk

    def body(self) -> bytes:
        """The whole body (small bodies only: JSON, NDJSON)."""
        return b"".join(self.chunks())

    def json(self) -> Any:
        """The body parsed as JSON (None when empty)."""
        data = self.body()
        return json.loads(data) if data else None

    def drain(self) -> None:
        """Read and drop whatever body is left, so the connection can serve the next request."""
        for _ in self.chunks():
            pass


@dataclass
class FileBody:
    """Bytes [start, end) of a file on disk, to stream as the response body."""

    path: Path
    start: int
    end: int


@dataclass
class Reply:
    """What to answer. `file` replaces the JSON body; status 0 means: hang up without answering."""

    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    file: FileBody | None = None
    rate_bps: float | None = None  # pace `file` to this many bytes per second (this connection)
    link: Link | None = None  # and within this budget, shared with every other response on the link
    disconnect_after: int | None = None  # send this many body bytes, then drop the connection
    # told of each piece of the body before it is handed to the socket (a negative count takes back a piece
    # whose write failed), so a client that holds the bytes never sees a smaller count in the fake's state
    on_sent: Callable[[int], None] | None = None

    @classmethod
    def hang_up(cls) -> Reply:
        """Close the connection without a response."""
        return cls(0)


class Dispatcher(Protocol):
    """What the server hands each request to."""

    def dispatch(self, request: HubRequest) -> Reply:
        """Decide the reply; may read the body."""
        ...


class Refused(Exception):
    """An early answer from a handler (no access, unknown revision or file, bad range)."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.status)
        self.reply = reply


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """[start, end) for a single `Range: bytes=...` header; None: serve the whole file.

    Multiple or malformed ranges are ignored (the whole file is served, as RFC 9110 allows).
    """
    match = _RANGE.fullmatch(header.strip()) if header else None
    if match is None or match.groups() == ("", ""):
        return None
    first, last = match.groups()
    if not first:
        start, end = max(0, size - int(last)), size
    else:
        start, end = int(first), min(size, int(last) + 1) if last else size
    if start >= size or start >= end:
        message = "Requested range not satisfiable"
        raise Refused(Reply(416, {"error": message}, {"Content-Range": f"bytes */{size}"}))
    return start, end


def piece_size(rate_bps: float | None) -> int:
    """How many bytes to write between pacing sleeps."""
    if rate_bps is None:
        return _MAX_PIECE
    return int(min(_MAX_PIECE, max(_MIN_PIECE, rate_bps / _PIECES_PER_S)))


class Link:
    """A token bucket that every connection drawing on it shares: bytes leave at `rate_bps` in all, with a
    burst of at most one piece's worth (1/50 s) after a quiet spell. A sender reserves its piece before it
    writes and sleeps for what the reservation says; reservations go into debt, so the waits queue up in
    the order they were asked for and no connection starves the others."""

    def __init__(self, rate_bps: float) -> None:
        if rate_bps <= 0:
            raise ValueError(f"a link's rate must be positive bytes per second, not {rate_bps!r}")
        self.rate_bps = rate_bps
        self.burst = rate_bps / _PIECES_PER_S
        self._tokens = self.burst
        self._at = time.monotonic()
        self._lock = threading.Lock()

    def reserve(self, size: int) -> float:
        """Take `size` bytes from the budget; returns how long to wait before sending them (seconds)."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate_bps) - size
            self._at = now
            return max(0.0, -self._tokens / self.rate_bps)


class _Handler(BaseHTTPRequestHandler):
    """Reads a request, asks the dispatcher, writes the reply."""

    server: HubServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: without it, ~40 ms a request

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, False)

    def _serve(self) -> None:
        request = HubRequest.read(self)
        try:
            reply = self.server.app.dispatch(request)
            if reply.status == 0:
                self._hang_up()
                return
            request.drain()
            self._write(reply, head_only=request.method == "HEAD")
        except (ConnectionError, TimeoutError):
            self.close_connection = True

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _serve

    def _write(self, reply: Reply, head_only: bool) -> None:
        if reply.file is None:
            payload = json.dumps(reply.body).encode() if reply.body is not None else b""
            self._start(reply, len(payload), "application/json")
            if not head_only:
                self.wfile.write(payload)
            return
        self._start(reply, reply.file.end - reply.file.start, "application/octet-stream")
        if not head_only:
            self._stream(reply, reply.file)

    def _start(self, reply: Reply, length: int, content_type: str) -> None:
        self.send_response(reply.status)
        headers = {"Content-Type": content_type, **reply.headers, "Content-Length": str(length)}
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()

    def _stream(self, reply: Reply, body: FileBody) -> None:
        """Write the file, sleeping so that bytes sent never run ahead of `rate_bps` since the start, nor
        of what the shared link grants."""
        sent = 0
        started = time.monotonic()
        rates = [r for r in (reply.rate_bps, reply.link.rate_bps if reply.link else None) if r]
        piece = piece_size(min(rates, default=None))
        with body.path.open("rb") as f:
            f.seek(body.start)
            left = body.end - body.start
            while left > 0:
                data = f.read(min(piece, left))
                if not data:
                    break
                if reply.link is not None and (wait := reply.link.reserve(len(data))) > 0:
                    time.sleep(wait)
                if reply.disconnect_after is not None and sent + len(data) >= reply.disconnect_after:
                    self._send(reply, data[: max(0, reply.disconnect_after - sent)])
                    self._hang_up()
                    return
                self._send(reply, data)
                sent += len(data)
                left -= len(data)
                if reply.rate_bps:
                    delay = started + sent / reply.rate_bps - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)

    def _send(self, reply: Reply, data: bytes) -> None:
        """Count `data` as sent, then write it: counted first, a client that already holds the bytes can
        never read a smaller count from the fake's state; a failed write takes its count back."""
        if reply.on_sent is not None:
            reply.on_sent(len(data))
        try:
            self.wfile.write(data)
        except BaseException:
            if reply.on_sent is not None:
                reply.on_sent(-len(data))
            raise

    def _hang_up(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):  # already gone
            self.connection.shutdown(socket.SHUT_RDWR)

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default per-request stderr line."""


class HubServer(ThreadingHTTPServer):
    """A threaded server that remembers its open connections, so `close_connections` can end them."""

    daemon_threads = True
    request_queue_size = 64

    def __init__(self, app: Dispatcher, port: int) -> None:
        self.app = app
        self._live: set[socket.socket] = set()
        self._live_lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _Handler)

    def track(self, conn: socket.socket, alive: bool) -> None:
        """Record a connection opening (True) or closing (False)."""
        with self._live_lock:
            if alive:
                self._live.add(conn)
            else:
                self._live.discard(conn)

    def server_close(self) -> None:
        """Close the listening socket and end every open connection (idle keep-alive ones too)."""
        self.close_connections()
        super().server_close()

    def close_connections(self) -> None:
        """Shut down every open connection (idle keep-alive ones too), ending their threads."""
        with self._live_lock:
            live = list(self._live)
        for conn in live:
            with contextlib.suppress(OSError):  # closed meanwhile
                conn.shutdown(socket.SHUT_RDWR)
