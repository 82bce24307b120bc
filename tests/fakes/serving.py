"""The lifecycle every fake shares: serve in a daemon thread, say where, stop, and work as `with fake:`.

A fake sets `port` (0: any free one) and implements `new_server`; `stop` ends the server and then calls
`after_stop` for what the fake keeps besides (nodes, a temporary home).
"""

from __future__ import annotations

import signal
import threading
from http.server import HTTPServer
from types import FrameType, TracebackType
from typing import Self


class Served:
    """Mixin: `start`, `url`, `stop`, context manager."""

    port: int
    _server: HTTPServer | None = None
    _thread: threading.Thread | None = None

    def new_server(self) -> HTTPServer:
        """The listening server (bound on 127.0.0.1:`port`)."""
        raise NotImplementedError

    def after_stop(self) -> None:
        """What else to release once the server is gone."""

    @property
    def url(self) -> str:
        """The base URL clients are pointed at."""
        if self._server is None:
            raise RuntimeError("fake not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> Self:
        """Serve in a daemon thread (returns at once; the socket is already listening)."""
        self._server = self.new_server()
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, then release the rest (`after_stop`); idempotent."""
        if self._server is not None:
            self._server.shutdown()
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._server.server_close()
            self._server = None
        self.after_stop()

    def serve_until_signalled(self) -> None:
        """Start, print the URL as the first line of stdout, serve until SIGTERM or SIGINT, then stop (a
        fake run as a process of its own)."""
        self.start()
        stopping = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stopping.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        print(self.url, flush=True)
        try:
            while not stopping.wait(0.5):
                pass
        finally:
            self.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
