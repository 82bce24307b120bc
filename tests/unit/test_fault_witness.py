"""The fault suite's witness of duplicate local heads (tests.faults.invariants.heads_per_name) counts heads,
not processes: a `ray start` process's own children look like it from fork to exec."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.invariants import heads_per_name

# A stand-in for `ray start --head --temp-dir=...`: with an argument, it forks a child that keeps the same
# command line (as Ray's children do until they exec), and both sleep.
STAND_IN = """
import os, sys, time
if sys.argv[-1] == "fork" and os.fork() == 0:
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


def write_meta(home: Path, name: str, temp_dir: str) -> None:
    node_dir = home / "nodes" / name
    node_dir.mkdir(parents=True)
    meta = {
        "name": name,
        "temp_dir": temp_dir,
        "ports": {"dashboard_port": 1},
        "worker_ports": [2, 3],
        "num_cpus": 1,
        "num_gpus": 0,
        "created_at": time.time(),
    }
    (node_dir / "meta.json").write_text(json.dumps(meta))


@pytest.fixture
def spawn() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def start(procs: list[subprocess.Popen[bytes]], temp_dir: str, *extra: str) -> None:
    argv = [sys.executable, "-c", STAND_IN, "start", "--head", f"--temp-dir={temp_dir}", *extra]
    procs.append(subprocess.Popen(argv, start_new_session=True))


def wait_for(home: Path, want: dict[str, int]) -> dict[str, int]:
    deadline = time.monotonic() + 10
    while (got := heads_per_name(home)) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    return got


def test_a_head_and_its_forked_child_count_once(tmp_path: Path, spawn: list[subprocess.Popen[bytes]]) -> None:
    temp_dir = f"/tmp/tf-witness-{tmp_path.name}"
    write_meta(tmp_path, "tf-a", temp_dir)
    start(spawn, temp_dir, "fork")
    time.sleep(1.0)  # the fork is there too
    assert wait_for(tmp_path, {"tf-a": 1}) == {"tf-a": 1}


def test_two_heads_of_one_name_count_twice(tmp_path: Path, spawn: list[subprocess.Popen[bytes]]) -> None:
    temp_dir = f"/tmp/tf-witness-{tmp_path.name}"
    write_meta(tmp_path, "tf-a", temp_dir)
    start(spawn, temp_dir, "fork")
    start(spawn, temp_dir)
    assert wait_for(tmp_path, {"tf-a": 2}) == {"tf-a": 2}
