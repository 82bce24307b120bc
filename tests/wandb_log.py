"""Reading an offline W&B run back from its transaction log (`run-<id>.wandb`), for tests.

wandb 0.31 ships no reader for it. The file is a LevelDB-style log: a 7-byte header (":W&B", a 2-byte
magic, a version byte), then 32 KiB blocks of records, each with a 7-byte header (CRC-32, 2-byte length,
type: FULL, FIRST, MIDDLE or LAST) whose payloads join into serialized `wandb_internal_pb2.Record`s.
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
FILE_HEADER = 7
RECORD_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[Any]:
    """Every Record in the log, in order (checksums verified)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B transaction log")
    pos, pending = FILE_HEADER, b""
    while pos + RECORD_HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < RECORD_HEADER:  # the block's tail is padding
            pos += left_in_block
            continue
        checksum, length, kind = struct.unpack("<IHB", data[pos : pos + RECORD_HEADER])
        payload = data[pos + RECORD_HEADER : pos + RECORD_HEADER + length]
        pos += RECORD_HEADER + length
        if kind == 0 and length == 0:
            continue
        if zlib.crc32(bytes([kind]) + payload) & 0xFFFFFFFF != checksum:
            raise ValueError(f"{path}: bad checksum at byte {pos}")
        if kind in (FULL, FIRST):
            pending = payload
        else:
            pending += payload
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


@dataclass
class OfflineRun:
    """What a test wants of a run: its id, config, history rows, summary and exit code."""

    run_id: str = ""
    project: str = ""
    group: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None


def read_run(path: Path) -> OfflineRun:
    """Fold the log at `path` into an OfflineRun."""
    run = OfflineRun()
    for record in records(path):
        which = record.WhichOneof("record_type")
        if which == "run":
            run.run_id, run.project, run.group = record.run.run_id, record.run.project, record.run.run_group
            _items(run.config, record.run.config.update)
        elif which == "config":
            _items(run.config, record.config.update)
        elif which == "history":
            row: dict[str, Any] = {}
            _items(row, record.history.item)
            run.history.append(row)
        elif which == "summary":
            _items(run.summary, record.summary.update)
        elif which == "exit":
            run.exit_code = record.exit.exit_code
    return run


def read_finished_run(path: Path, timeout: float = 60.0) -> OfflineRun:
    """The run at `path` once its exit record is on disk. `run.finish()` returns before wandb-core, a
    process of its own, has written the log out (under load, seconds later), so a reader polls."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            run = read_run(path)
        except ValueError:  # a record half written
            run = OfflineRun()
        if run.exit_code is not None or time.monotonic() > deadline:
            return run
        time.sleep(0.2)


def _items(into: dict[str, Any], items: Any) -> None:
    for item in items:
        key = ".".join(item.nested_key) if item.nested_key else item.key
        into[key] = json.loads(item.value_json)
