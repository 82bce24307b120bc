"""The lifecycle every fake shares: serve in a daemon thread, say where, stop, and work as `with fake:`.

A fake sets `port` (0: any free one) and implements `new_server`; `stop` ends the server and then calls
`after_stop` for what the fake keeps besides (nodes, a temporary home).

A fake served as a process of its own (`python -m tests.fakes serve ...`) prints its URL as the first line
of stdout, then the settings that point the fleet (or the vendor's own client) at it as ready-to-paste
`export NAME=value` lines, between EXPORTS_BEGIN and EXPORTS_END.
"""

from __future__ import annotations

import shlex
import signal
import threading
from collections.abc import Callable, Mapping
from http.server import HTTPServer
from types import FrameType, TracebackType
from typing import Self

EXPORTS_BEGIN = "# the settings for this fake: paste these lines into the shell that runs the fleet"
EXPORTS_END = "# serving until Ctrl-C or SIGTERM"


def export_lines(settings: Mapping[str, str]) -> list[str]:
    """`settings` as shell `export NAME=value` lines (values quoted for the shell), between the markers."""
    exports = [f"export {name}={shlex.quote(value)}" for name, value in settings.items()]
    return [EXPORTS_BEGIN, *exports, EXPORTS_END]


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

    def serve_until_signalled(self, settings: Callable[[], Mapping[str, str]] | None = None) -> None:
        """Start, print the URL as the first line of stdout and then `settings()` (the environment that
        points a client here, asked once the URL is known) as `export` lines, serve until SIGTERM or
        SIGINT, then stop (a fake run as a process of its own)."""
        self.start()
        stopping = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stopping.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        print("\n".join([self.url, *export_lines(settings() if settings else {})]), flush=True)
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
