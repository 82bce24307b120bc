"""What a transfer keeps on disk, so that it resumes: partial files, their sidecars and the manifest.

All of it lives under ``<dest>/.trainfleet/`` (`STATE_DIR`):
- ``partial/<path>`` is a file being filled; ``progress/<path>.json``, its sidecar, lists the byte ranges
  on disk and the identity (sha256 or git blob id) of the content they belong to (`PartialFile`). A sidecar
  for other content is dropped with its partial file.
- A finished file is verified (size; sha256 or git blob id when known) and renamed into place, so a file
  at its final path is always complete; ``manifest.json`` maps each finished path to its identity
  (`Manifest`), and a re-run skips a file whose entry and size still match.

`Item` names one file to fetch and `missing` / `merged` are the arithmetic of byte spans. Fetching the
bytes over HTTP is trainer.transfer's.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from trainer.errors import DownloadError

MIB = 1024 * 1024
STATE_DIR = ".trainfleet"

Span = tuple[int, int]  # [start, end) in bytes


@dataclass(frozen=True)
class Item:
    """One file to fetch: its URL, its path under the destination, and what its content must be."""

    path: str  # relative, with "/" separators
    url: str
    size: int
    sha256: str | None = None  # checked when known (the Hub gives it for LFS files)
    git_oid: str | None = None  # the git blob id, checked when known and there is no sha256

    @property
    def identity(self) -> str:
        """What names this content: a changed file on the server gets a new identity."""
        return self.sha256 or self.git_oid or self.url


def missing(done: Sequence[Span], size: int) -> list[Span]:
    """The spans of [0, size) that the sorted, merged spans `done` do not cover."""
    gaps, at = [], 0
    for start, end in done:
        if start > at:
            gaps.append((at, start))
        at = max(at, end)
    return [*gaps, (at, size)] if at < size else gaps


def merged(spans: Iterable[Span]) -> list[Span]:
    """Sorted spans with overlapping and touching ones joined."""
    out: list[Span] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


class PartialFile:
    """One file being filled: its partial file, its sidecar of finished spans, and its verification."""

    def __init__(self, item: Item, dest: Path) -> None:
        self.item = item
        self.final = dest / item.path
        self.partial = dest / STATE_DIR / "partial" / item.path
        self.sidecar = dest / STATE_DIR / "progress" / f"{item.path}.json"  # its own tree: no name clashes
        self.done: list[Span] = []
        self.lock = threading.Lock()
        self.finished = False

    def open(self) -> list[Span]:
        """Reuse the spans a previous run left for this content, or start afresh; returns what is missing."""
        try:
            state = json.loads(self.sidecar.read_text())
            if state["identity"] == self.item.identity and self.partial.stat().st_size == self.item.size:
                self.done = merged((int(a), int(b)) for a, b in state["done"])
        except (OSError, ValueError, KeyError, TypeError):
            self.done = []
        if not self.done:
            self.partial.parent.mkdir(parents=True, exist_ok=True)
            self.sidecar.parent.mkdir(parents=True, exist_ok=True)
            with open(self.partial, "wb") as f:
                if self.item.size:
                    try:
                        os.posix_fallocate(f.fileno(), 0, self.item.size)
                    except (AttributeError, OSError):  # not on this platform or file system: sparse will do
                        f.truncate(self.item.size)
            self._save()
        return missing(self.done, self.item.size)

    def record(self, span: Span) -> bool:
        """Note `span` as on disk; returns True (once) when that completes the file."""
        with self.lock:
            self.done = merged([*self.done, span])
            self._save()
            complete = self.done == [(0, self.item.size)] or self.item.size == 0
            if complete and not self.finished:
                self.finished = True
                return True
            return False

    def finish(self) -> None:
        """Verify the partial file and move it into place; a mismatch discards it (a re-run starts over)."""
        problem = self._check()
        if problem:
            self.partial.unlink(missing_ok=True)
            self.sidecar.unlink(missing_ok=True)
            raise DownloadError(f"{self.item.path}: {problem}; the download was discarded")
        self.final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.partial, self.final)
        self.sidecar.unlink(missing_ok=True)

    def _check(self) -> str:
        size = self.partial.stat().st_size
        if size != self.item.size:
            return f"{size} bytes on disk, the server lists {self.item.size}"
        want = self.item.sha256 or self.item.git_oid
        if want is None:
            return ""
        digest = hashlib.sha256() if self.item.sha256 else hashlib.sha1(b"blob %d\0" % size)
        with open(self.partial, "rb") as f:
            while chunk := f.read(8 * MIB):
                digest.update(chunk)
        return "" if digest.hexdigest() == want else f"content digest {digest.hexdigest()} is not {want}"

    def _save(self) -> None:
        state = {"identity": self.item.identity, "size": self.item.size, "done": self.done}
        tmp = self.sidecar.with_name(self.sidecar.name + ".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.sidecar)


class Manifest:
    """``<dest>/.trainfleet/manifest.json``: the identity of every finished file, plus the caller's meta."""

    def __init__(self, dest: Path, meta: Mapping[str, str]) -> None:
        self.path = dest / STATE_DIR / "manifest.json"
        self.lock = threading.Lock()
        try:
            self.files: dict[str, str] = dict(json.loads(self.path.read_text())["files"])
        except (OSError, ValueError, KeyError, TypeError):
            self.files = {}
        self.meta = meta

    def has(self, item: Item, dest: Path) -> bool:
        """Whether `item` is already in place: the same identity recorded, and the right size on disk."""
        final = dest / item.path
        return (
            self.files.get(item.path) == item.identity
            and final.is_file()
            and final.stat().st_size == item.size
        )

    def mark(self, item: Item) -> None:
        """Record a finished file (atomically, so a crash leaves the old manifest or the new one)."""
        with self.lock:
            self.files[item.path] = item.identity
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name("manifest.json.tmp")
            tmp.write_text(json.dumps({**self.meta, "files": self.files}, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
