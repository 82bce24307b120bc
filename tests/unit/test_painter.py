"""service.painter: loss pictures drawn by a child process, so the notifier's threads keep the interpreter
while a picture is drawn. The child is real (python -m service.painter): it draws, it survives nothing it
should not (its parent's death ends it), and a dead or slow one is replaced."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

import pytest
from PIL import Image

from service.describe import LossCurve
from service.painter import Painter, PictureFailed, serve

CURVE = LossCurve(train=[(step, 4.0 - step * 0.05) for step in range(1, 41)], eval=[(10, 3.6), (20, 3.1)])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is not alive
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_the_picture_is_drawn_by_a_child_that_is_kept_for_the_next_one() -> None:
    painter = Painter()
    try:
        png = painter.png(CURVE, "r1 (SUCCEEDED)")
        child = painter.pid
        assert child is not None and child != os.getpid()
        with Image.open(io.BytesIO(png)) as image:
            assert image.format == "PNG" and image.size == (800, 450)
        assert painter.png(CURVE, "r2") != png and painter.pid == child  # another title, the same child
    finally:
        painter.close()
    assert painter.pid is None and not _alive(child)


def test_a_dead_child_is_replaced_and_a_slow_one_killed() -> None:
    painter = Painter()
    try:
        painter.png(CURVE, "r1")
        first = painter.pid
        assert first is not None
        os.kill(first, 9)
        assert painter.png(CURVE, "r1") and painter.pid not in (None, first)
        second = painter.pid
        assert second is not None
        painter.timeout_s = 0.001  # no picture is drawn that fast
        with pytest.raises(PictureFailed, match="took more than"):
            painter.png(CURVE, "r1")
        assert painter.pid is None and not _alive(second)
    finally:
        painter.close()


def test_a_request_the_child_cannot_draw_is_answered_with_why() -> None:
    request = json.dumps({"curve": CURVE.model_dump(mode="json")}).encode()  # no title
    answers = io.BytesIO()
    serve(io.BytesIO(len(request).to_bytes(4, "big") + request), answers)
    answer = answers.getvalue()
    assert answer[0] == 1 and int.from_bytes(answer[1:5], "big") == len(answer) - 5
    assert answer[5:].decode() == "KeyError: 'title'"


def test_the_child_ends_with_its_parent_even_when_the_parent_is_killed() -> None:
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from service.painter import Painter\n"
            "from service.describe import LossCurve\n"
            "p = Painter(); p.png(LossCurve(train=[(1, 2.0), (2, 1.0)]), 't')\n"
            "print(p.pid, flush=True); time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)
