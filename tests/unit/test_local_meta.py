"""providers.local.client: a head's meta.json stays whole when several processes write it at once."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from providers.local.client import HeadMeta, LocalHeads


def write_many(nodes: str, rounds: int) -> None:
    heads = LocalHeads(Path(nodes))
    for i in range(rounds):
        heads._write(HeadMeta("tf-r-1", "/tmp/x", {"dashboard_port": 1}, (2, 3), 1, 0, float(i)))


def test_concurrent_writers_never_lose_the_file(tmp_path: Path) -> None:
    """finalize and the reaper may both stop one head; with one shared temporary name, one of them found
    its file moved away by the other (FileNotFoundError) and the run failed."""
    (tmp_path / "tf-r-1").mkdir()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=write_many, args=(str(tmp_path), 300)) for _ in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert [proc.exitcode for proc in procs] == [0, 0, 0, 0]
    meta = LocalHeads(tmp_path).read("tf-r-1")
    assert meta is not None and meta.name == "tf-r-1"
    assert sorted(p.name for p in (tmp_path / "tf-r-1").iterdir()) == ["meta.json"]  # no temporary left
