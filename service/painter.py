"""Loss pictures drawn in a child process, for a process whose threads must keep answering meanwhile.

Drawing a picture (service.plot, matplotlib) is a fraction of a second of pure Python, and it holds the
interpreter's lock all that time. The notifier's lanes each wait on a socket; every time one gets its answer
it must take that lock back, and while a picture is drawn each of them waits up to a switch interval for it,
request after request. Measured (bench/notify.py, 200 runs, no 429s): every event's p99 went from 5 ms to
1.2 s when the result messages carried their pictures drawn in the notifier. So the notifier's pictures are
drawn by a child, `python -m service.painter`, started at the first picture and kept for the next ones.

The child reads requests from its stdin and writes answers to its stdout, both length-prefixed: a request
is JSON (`curve`, `title`), an answer one status byte (0: the PNG follows, 1: an error's text follows).
It ends when its stdin closes, so it ends with its parent however that ends (even killed). A child that
takes longer than `timeout_s` is killed and the call fails (PictureFailed); one found dead is replaced, and
the picture asked of the new one.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
from typing import IO

from service.describe import LossCurve

OK, ERROR = 0, 1


class PictureFailed(Exception):
    """The picture could not be drawn (the painter failed, died or timed out)."""


class Painter:
    """Draws loss pictures in a child process of its own, one at a time (they come at a run's end)."""

    def __init__(self, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self._child: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def png(self, curve: LossCurve, title: str) -> bytes:
        """The picture as PNG bytes (service.plot.png), drawn by the child (a second one when the first
        died before it answered: it may have died long before this call)."""
        request = json.dumps({"curve": curve.model_dump(mode="json"), "title": title}).encode()
        with self._lock:
            try:
                status, answer = self._ask(request)
            except (OSError, EOFError):
                self._stop()
                try:
                    status, answer = self._ask(request)
                except (OSError, EOFError) as exc:
                    self._stop()
                    raise PictureFailed(f"the painter died: {exc}") from None
        if status != OK:
            raise PictureFailed(answer.decode(errors="replace"))
        return answer

    def _ask(self, request: bytes) -> tuple[int, bytes]:
        """The child's answer to `request` (its status, its payload)."""
        child = self._start()
        assert child.stdin is not None and child.stdout is not None
        _send(child.stdin, request)
        ready, _, _ = select.select([child.stdout], [], [], self.timeout_s)
        if not ready:
            self._stop()
            raise PictureFailed(f"the painter took more than {self.timeout_s:g} s")
        return _read(child.stdout, 1)[0], _receive(child.stdout)

    @property
    def pid(self) -> int | None:
        """The child's process id, while one runs."""
        return self._child.pid if self._child is not None and self._child.poll() is None else None

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _start(self) -> subprocess.Popen[bytes]:
        if self._child is None or self._child.poll() is not None:
            self._child = subprocess.Popen(
                [sys.executable, "-m", "service.painter"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,  # a Ctrl-C at the terminal is the parent's to handle, not the child's
            )
        return self._child

    def _stop(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.kill()
            child.wait()
            for pipe in (child.stdin, child.stdout):
                if pipe is not None:
                    pipe.close()


def _send(pipe: IO[bytes], payload: bytes) -> None:
    pipe.write(len(payload).to_bytes(4, "big") + payload)
    pipe.flush()


def _receive(pipe: IO[bytes]) -> bytes:
    return _read(pipe, int.from_bytes(_read(pipe, 4), "big"))


def _read(pipe: IO[bytes], size: int) -> bytes:
    data = pipe.read(size)
    if data is None or len(data) < size:
        raise EOFError("the painter's output ended")
    return data


def serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    """The child: draw each request's picture until the requests end."""
    from service import plot

    while True:
        try:
            request = json.loads(_receive(requests))
        except EOFError:
            return
        try:
            status, answer = OK, plot.png(LossCurve.model_validate(request["curve"]), str(request["title"]))
        except Exception as exc:  # noqa: BLE001  (the parent logs it; the message goes without it)
            status, answer = ERROR, f"{type(exc).__name__}: {exc}".encode()
        answers.write(bytes([status]))
        _send(answers, answer)


if __name__ == "__main__":
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever a library prints goes to stderr, never into the answers
    serve(sys.stdin.buffer, answers)
