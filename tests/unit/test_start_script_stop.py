"""A rented node's start script, told to stop (SIGTERM to the container's first process, as a vendor's stop
sends): it writes the node's stop notice for the trainer, keeps Ray until the trainer says its checkpoint is
kept or the grace runs out, then ends Ray, and the container with it. The script for real, under sh, with
a `ray` that records the signals it gets (the trainer's side: tests/unit/test_stopnotice.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from providers.bootstrap import NODE_NOTICE, STOP_GRACE_S, node_setup_env, start_script
from trainer.stopnotice import NOTICE_ENV, SAVED_SUFFIX

SHORT_GRACE_S = 2


def wait_for(what: str, check: object, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class Node:
    """The start script under sh, with a fake `ray` that runs until SIGTERM and says when it got one."""

    def __init__(self, tmp_path: Path, worker: bool, grace_s: int = STOP_GRACE_S) -> None:
        self.calls = tmp_path / "ray.calls"
        self.notice = tmp_path / "container-tmp" / "stop-notice"  # where a container's /tmp would have it
        self.notice.parent.mkdir()
        self.saved = self.notice.with_name(self.notice.name + SAVED_SUFFIX)
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        ray = bin_dir / "ray"
        ray.write_text(
            "#!/bin/sh\n"
            f"trap 'echo TERM >> {self.calls}; exit 0' TERM\n"
            f'echo "start $*" >> {self.calls}\n'
            "while :; do sleep 0.05; done\n"
        )
        ray.chmod(0o755)
        script = start_script(None, worker=worker)
        assert (
            f"-lt {STOP_GRACE_S} " in script and f'{NOTICE_ENV}="${{{NOTICE_ENV}:-{NODE_NOTICE}}}"' in script
        )
        env = {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "FLEET_RAY_TOKEN": "t0k",
            "FLEET_NODE_ROOT": str(tmp_path / "root"),
            NOTICE_ENV: str(self.notice),
            "FLEET_RAY_HEAD_ADDRESS": "127.0.0.1:6379",
            **node_setup_env(),
            "FLEET_NODE_PINS": "",  # the node's software is all there: nothing to install
        }
        script = script.replace(f"-lt {STOP_GRACE_S} ", f"-lt {grace_s} ")
        self.proc = subprocess.Popen(["sh", "-c", script], env=env, start_new_session=True)
        wait_for("ray to start", lambda: self.said().count("start") == 1)

    def said(self) -> list[str]:
        text = self.calls.read_text() if self.calls.exists() else ""
        return [line.split()[0] for line in text.splitlines()]

    def stop(self) -> float:
        """SIGTERM to the script (only to it: a container's stop reaches its first process); when."""
        os.kill(self.proc.pid, signal.SIGTERM)
        return time.monotonic()


@pytest.fixture
def nodes() -> Iterator[list[Node]]:
    made: list[Node] = []
    yield made
    for node in made:  # the script's whole group: its `ray` too, which a failed case may have left running
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.proc.pid, signal.SIGKILL)
        node.proc.wait(10)


@pytest.mark.parametrize("worker", [False, True], ids=["head", "worker"])
def test_sigterm_writes_the_notice_and_ray_ends_once_the_trainer_kept_its_checkpoint(
    tmp_path: Path, nodes: list[Node], worker: bool
) -> None:
    node = Node(tmp_path, worker)
    nodes.append(node)
    node.saved.write_text("an earlier stop's answer\n")  # a leftover must not end Ray early
    node.stop()
    wait_for("the stop notice", node.notice.exists)
    time.sleep(1.5)
    assert node.said() == ["start"] and node.proc.poll() is None  # Ray keeps running for the trainer
    saved = time.monotonic()
    node.saved.write_text("kept\n")  # what the trainer writes (trainer.stopnotice)
    assert node.proc.wait(10) == 0  # Ray's own exit, and the script's: the container ends
    assert node.said() == ["start", "TERM"]  # ended, and not started again (a worker's join loop stops)
    assert time.monotonic() - saved < 3.0  # at once, not after the grace


def test_without_an_answer_ray_ends_after_the_grace(tmp_path: Path, nodes: list[Node]) -> None:
    node = Node(tmp_path, worker=False, grace_s=SHORT_GRACE_S)
    nodes.append(node)
    told = node.stop()
    assert node.proc.wait(SHORT_GRACE_S + 10) == 0
    waited = time.monotonic() - told
    assert SHORT_GRACE_S - 0.5 <= waited < SHORT_GRACE_S + 3.0, waited
    assert node.said() == ["start", "TERM"]
    assert node.notice.read_text() == "SIGTERM\n"
