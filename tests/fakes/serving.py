"""The lifecycle every fake shares: serve in a daemon thread, say where, stop, and work as `with fake:`.

A fake sets `port` (0: any free one) and implements `new_server`; `stop` ends the server and then calls
`after_stop` for what the fake keeps besides (nodes, a temporary home).
"""

from __future__ import annotations

import threading
from http.server import HTTPServer
from types import TracebackType
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

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
