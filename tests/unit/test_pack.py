"""trainer.pack: an output directory through a job log and back, byte for byte, or a clear refusal."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import random
import tarfile
from pathlib import Path
from typing import Any

import pytest

from trainer import pack, progress
from trainer.errors import PackError


def make_output(root: Path) -> Path:
    out = root / "out"
    (out / "tokenizer").mkdir(parents=True)
    (out / "adapter_model.safetensors").write_bytes(random.Random(0).randbytes(200_000))  # > 4 chunks
    (out / "adapter_config.json").write_text('{"r": 8}')
    (out / "tokenizer" / "vocab.json").write_text("{}")
    return out


def packed_records(out: Path, capsys: pytest.CaptureFixture[str], **kw: Any) -> list[dict[str, Any]]:
    pack.pack(out, **kw)
    return list(progress.parse(capsys.readouterr().out))


def test_round_trip_is_byte_identical(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = make_output(tmp_path)
    records = packed_records(out, capsys)
    assert [r["kind"] for r in records[:-1]] == ["chunk"] * (len(records) - 1) and len(records) > 2
    dest = tmp_path / "back" / "outputs"
    dest.mkdir(parents=True)
    (dest / "stale.txt").write_text("from an earlier try")
    got = pack.unpack(records, dest)
    assert got.files == 3 and records[-1]["sha256"] == got.sha256
    for f in out.rglob("*"):
        if f.is_file():
            assert (dest / f.relative_to(out)).read_bytes() == f.read_bytes()
    assert not (dest / "stale.txt").exists()  # replaced whole, not merged
    assert not (dest.parent / "outputs.partial").exists()


def test_a_missing_or_damaged_chunk_leaves_the_destination_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = packed_records(make_output(tmp_path), capsys)
    dest = tmp_path / "dest"
    with pytest.raises(PackError, match=r"1 of \d+ chunks missing"):
        pack.unpack(records[1:], dest)
    damaged = [dict(r) for r in records]
    raw = bytearray(base64.b64decode(damaged[0]["data"]))
    raw[100] ^= 0xFF
    damaged[0]["data"] = base64.b64encode(bytes(raw)).decode()
    with pytest.raises(PackError, match="damaged"):
        pack.unpack(damaged, dest)
    with pytest.raises(PackError, match="no PACKED line"):
        pack.unpack(records[:-1], dest)
    assert not dest.exists()


def test_too_large_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(PackError, match="set hub_model_id"):
        pack.pack(make_output(tmp_path), limit_bytes=1000)
    with pytest.raises(PackError, match="not a directory"):
        pack.pack(tmp_path / "nothing")


def test_an_archive_that_points_outside_is_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    data = buffer.getvalue()
    records = [
        {"kind": "chunk", "seq": 0, "data": base64.b64encode(data).decode()},
        {"kind": "packed", "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "chunks": 1},
    ]
    json.dumps(records)  # what a job log would carry
    with pytest.raises(PackError, match="cannot unpack"):
        pack.unpack(records, tmp_path / "dest" / "out")
    assert not (tmp_path / "dest" / "escaped.txt").exists()
    assert not (tmp_path / "dest" / "out").exists()
