"""Bringing a run's results back from a rented node through its Ray job's log.

A rented node shares no disk with the fleet, and the Ray Jobs API uploads files (runtime_env) but has no
download. So `python -m trainer pack` writes the output directory as a gzipped tar, in base64 CHUNK
progress lines, then one PACKED line with its size and sha256; the fleet reads the job's log, checks the
digest and unpacks it with tarfile's "data" filter (no absolute paths, no links out, no devices). This
suits adapters (megabytes); a larger output is refused with a reason, since a hub push is the way for it.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import tarfile
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.errors import PackError
from trainer.progress import Kind, emit

CHUNK_BYTES = 48 * 1024  # 64 KiB of base64 per log line
DEFAULT_LIMIT_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Packed:
    """What came back: the archive's size and digest, and how many files it held; or why nothing came
    (`skipped`: too large, and the results are on the hub)."""

    bytes: int
    sha256: str
    files: int
    skipped: str | None = None


def pack(directory: Path, limit_bytes: int = DEFAULT_LIMIT_BYTES, skip_over_limit: bool = False) -> Packed:
    """Emit `directory` as CHUNK lines and a closing PACKED line. PackError if it is missing or the
    archive would exceed `limit_bytes`; with `skip_over_limit` (the results are on the hub already), a
    PACKED line that says why nothing travels."""
    if not directory.is_dir():
        raise PackError(f"nothing to bring back: {directory} is not a directory")
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in files)
    if total > limit_bytes:
        why = (
            f"{directory} holds {total / 2**20:.1f} MiB, more than the {limit_bytes / 2**20:.0f} MiB that "
            "travel back through the job log"
        )
        if not skip_over_limit:
            raise PackError(f"{why}; set hub_model_id to push it to the hub instead")
        emit(Kind.PACKED, skipped=why, files=len(files), bytes=total)
        return Packed(bytes=0, sha256="", files=len(files), skipped=why)
    with tempfile.TemporaryFile() as archive:
        with tarfile.open(fileobj=archive, mode="w:gz") as tar:
            for path in files:
                tar.add(path, arcname=path.relative_to(directory).as_posix(), recursive=False)
        size = archive.tell()
        archive.seek(0)
        digest = hashlib.sha256()
        seq = 0
        while chunk := archive.read(CHUNK_BYTES):
            digest.update(chunk)
            emit(Kind.CHUNK, seq=seq, data=base64.b64encode(chunk).decode("ascii"))
            seq += 1
    packed = Packed(bytes=size, sha256=digest.hexdigest(), files=len(files))
    emit(Kind.PACKED, bytes=packed.bytes, sha256=packed.sha256, files=packed.files, chunks=seq)
    return packed


def unpack(records: Iterable[Mapping[str, Any]], dest: Path) -> Packed:
    """Rebuild the archive from a pack job's progress records and extract it as `dest` (replacing what
    was there, all at once). PackError if a chunk is missing or the digest differs; `dest` is untouched."""
    chunks: dict[int, bytes] = {}
    summary: Mapping[str, Any] | None = None
    for record in records:
        if record.get("kind") == Kind.CHUNK:
            chunks[int(record["seq"])] = base64.b64decode(record["data"], validate=True)
        elif record.get("kind") == Kind.PACKED:
            summary = record
    if summary is None:
        raise PackError("the pack job's log has no PACKED line: it did not finish")
    if summary.get("skipped"):
        return Packed(bytes=0, sha256="", files=int(summary.get("files", 0)), skipped=str(summary["skipped"]))
    expected = int(summary["chunks"])
    missing = sorted(set(range(expected)) - set(chunks))
    if missing:
        raise PackError(f"{len(missing)} of {expected} chunks missing from the pack job's log")
    data = b"".join(chunks[i] for i in range(expected))
    if len(data) != summary["bytes"] or hashlib.sha256(data).hexdigest() != summary["sha256"]:
        raise PackError("the packed output arrived damaged (size or sha256 differs)")
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with tempfile.TemporaryFile() as archive:
        archive.write(data)
        archive.seek(0)
        try:
            with tarfile.open(fileobj=archive, mode="r:gz") as tar:
                tar.extractall(partial, filter="data")
        except (tarfile.TarError, OSError) as exc:
            shutil.rmtree(partial, ignore_errors=True)
            raise PackError(f"cannot unpack the output: {exc}") from exc
    if dest.exists():
        shutil.rmtree(dest)
    partial.rename(dest)
    return Packed(bytes=len(data), sha256=str(summary["sha256"]), files=int(summary.get("files", 0)))
