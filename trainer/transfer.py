"""Fetch a set of files over HTTP on many connections at once, large files split into byte ranges.

One connection to a CDN carries far less than a node's link, and a model is often one big safetensors
file, so parallel *files* are not enough: every file is cut into parts (`Range` requests), and one pool of
`connections` threads sharing one httpx connection pool fetches the parts of all files, largest first,
each written at its offset into a preallocated partial file. Small files are one part, one request.

Resumable, at three levels, all under ``<dest>/.trainfleet/``:
- ``partial/<path>`` is a file being filled; ``progress/<path>.json``, its sidecar, lists the byte ranges
  on disk and the identity (sha256 or git blob id) of the content they belong to. A range is recorded
  when a part finishes, and also when a part is cut short (its own failure, or another part's stopping
  the rest), so a later run asks only for the missing bytes, whatever its part size. A sidecar for other
  content is dropped with its partial file.
- A retried part (within a run) resumes from the last byte it wrote.
- A finished file is verified (size; sha256 or git blob id when known) and renamed into place, so a file
  at its final path is always complete; ``manifest.json`` maps each finished path to its identity, and a
  re-run skips a file whose entry and size still match.

A failed part is retried with exponential back-off (a 429's Retry-After is honoured); past `retries`
attempts the transfer stops and raises DownloadError. Bytes written survive a killed process (they are
in the page cache); a machine crash that loses some is caught by the digest check.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import httpx

from trainer.errors import DownloadError

MIB = 1024 * 1024
MIN_PART_BYTES = 1 * MIB
MAX_PART_BYTES = 64 * MIB
PARTS_PER_CONNECTION = 4  # a few parts per connection, so the last round leaves few connections idle
DEFAULT_RETRIES = 5
MAX_BACKOFF_S = 10.0
MAX_RETRY_AFTER_S = 60.0
STATE_DIR = ".trainfleet"
_TIMEOUT = httpx.Timeout(30.0, connect=10.0)

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


@dataclass
class TransferStats:
    """What one `transfer` did: bytes and files fetched now, and those already on disk (skipped)."""

    bytes: int = 0
    files: int = 0
    bytes_skipped: int = 0
    files_skipped: int = 0
    requests: int = 0
    retries: int = 0
    connections: int = 0  # the most requests that were in flight at once
    seconds: float = 0.0


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


def part_size_for(total_bytes: int, connections: int) -> int:
    """Parts small enough that every connection gets several, within [1 MiB, 64 MiB]."""
    wanted = math.ceil(total_bytes / max(1, connections * PARTS_PER_CONNECTION))
    return min(MAX_PART_BYTES, max(MIN_PART_BYTES, wanted))


def retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date), capped; None if absent."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(MAX_RETRY_AFTER_S, max(0.0, seconds))


class _Retry(Exception):
    """A part failed in a way worth trying again (a dropped connection, a 5xx, a 429)."""

    def __init__(self, reason: str, delay: float | None = None) -> None:
        super().__init__(reason)
        self.delay = delay


class _File:
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


class _Manifest:
    """``<dest>/.trainfleet/manifest.json``: the identity of every finished file, plus the caller's meta."""

    def __init__(self, dest: Path, meta: dict[str, Any]) -> None:
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


@dataclass(frozen=True)
class _Part:
    """Bytes [start, end) of one file; start == end for a file with nothing left to fetch but the check."""

    file: _File
    start: int
    end: int


class _Transfer:
    """One run of `transfer`: the shared client, the stop flag and the counters."""

    def __init__(self, client: httpx.Client, manifest: _Manifest, retries: int, backoff_s: float) -> None:
        self.client = client
        self.manifest = manifest
        self.retries = retries
        self.backoff_s = backoff_s
        self.stats = TransferStats()
        self.lock = threading.Lock()  # guards stats and in_flight
        self.stop = threading.Event()
        self.in_flight = 0

    def run_part(self, part: _Part) -> None:
        """Fetch one part, with retries; record what reached the disk even when it fails or is stopped.

        A failure sets the stop flag, so the other parts end at their next chunk instead of running on.
        """
        pos = [part.start]  # advanced by _fetch as bytes are written
        try:
            try:
                self._attempts(part, pos)
            finally:
                if pos[0] > part.start or part.start == part.end:
                    self._record(part.file, (part.start, pos[0]))
        except (OSError, httpx.HTTPError) as exc:  # a full disk, a redirect loop, ...
            self.stop.set()
            raise DownloadError(f"{part.file.item.path}: {type(exc).__name__}: {exc}") from exc
        except BaseException:
            self.stop.set()
            raise

    def _attempts(self, part: _Part, pos: list[int]) -> None:
        attempt = 0
        while pos[0] < part.end and not self.stop.is_set():
            try:
                self._fetch(part, pos)
            except _Retry as exc:
                attempt += 1
                if attempt > self.retries:
                    raise DownloadError(
                        f"{part.file.item.path}: bytes {pos[0]}-{part.end - 1}: {exc} "
                        f"(attempt {attempt} of {self.retries + 1}: giving up)"
                    ) from exc
                with self.lock:
                    self.stats.retries += 1
                backoff = min(MAX_BACKOFF_S, self.backoff_s * 2 ** (attempt - 1))
                self.stop.wait(exc.delay if exc.delay is not None else backoff)

    def _record(self, file: _File, span: Span) -> None:
        if file.record(span):
            file.finish()
            self.manifest.mark(file.item)
            with self.lock:
                self.stats.files += 1

    def _fetch(self, part: _Part, pos: list[int]) -> None:
        """One request for bytes [pos, end) of the part, written as they arrive; `pos` follows the writes."""
        item, end = part.file.item, part.end
        with self.lock:
            self.stats.requests += 1
            self.in_flight += 1
            self.stats.connections = max(self.stats.connections, self.in_flight)
        try:
            headers = {"Range": f"bytes={pos[0]}-{end - 1}"}
            with self.client.stream("GET", item.url, headers=headers) as reply:
                _check_status(reply, item, pos[0], end)
                with open(part.file.partial, "r+b") as out:
                    out.seek(pos[0])
                    for chunk in reply.iter_bytes():
                        if self.stop.is_set():
                            return
                        piece = chunk[: end - pos[0]]
                        out.write(piece)
                        pos[0] += len(piece)
                        with self.lock:
                            self.stats.bytes += len(piece)
                        if pos[0] >= end:
                            return
            raise _Retry("the body ended early")
        except httpx.TransportError as exc:  # refused, reset or dropped mid-body; timeouts
            raise _Retry(f"{type(exc).__name__}: {exc}") from exc
        finally:
            with self.lock:
                self.in_flight -= 1


def _check_status(reply: httpx.Response, item: Item, start: int, end: int) -> None:
    """Raise _Retry for 429 and 5xx, DownloadError for any answer other than the bytes asked for."""
    status = reply.status_code
    if status == 429 or status >= 500:
        raise _Retry(f"HTTP {status}", retry_after(reply.headers.get("retry-after")))
    if status == 206:
        if not reply.headers.get("content-range", "").startswith(f"bytes {start}-"):
            raise DownloadError(f"{item.path}: the server sent another range than bytes {start}-")
    elif status != 200 or (start, end) != (0, item.size):
        hint = " (it ignored the Range header)" if status == 200 else ""
        raise DownloadError(f"{item.path}: HTTP {status} {reply.reason_phrase}{hint}")


def transfer(
    items: Sequence[Item],
    dest: Path,
    headers: dict[str, str],
    *,
    connections: int = 16,
    part_size: int | None = None,
    retries: int = DEFAULT_RETRIES,
    backoff_s: float = 0.5,
    meta: dict[str, Any] | None = None,
) -> TransferStats:
    """Fetch `items` into `dest` on `connections` parallel connections; returns what it did.

    Files already finished (per the manifest) are skipped, partial ones resume. `headers` go with every
    request (e.g. Authorization); httpx drops Authorization when a redirect leaves the host, as a CDN
    URL needs. `part_size` defaults to `part_size_for` the bytes missing. `meta` is stored in the manifest.
    Raises DownloadError naming the first file that failed; what was fetched stays for a re-run.
    """
    started = time.monotonic()
    for item in items:
        relative = PurePosixPath(item.path)
        if relative.is_absolute() or ".." in relative.parts or not relative.parts:
            raise DownloadError(f"refusing to write {item.path!r} outside {dest}")
    manifest = _Manifest(dest, meta or {})
    todo: list[tuple[_File, list[Span]]] = []
    files_skipped = bytes_skipped = 0
    for item in items:
        if manifest.has(item, dest):
            files_skipped += 1
            bytes_skipped += item.size
            continue
        file = _File(item, dest)
        gaps = file.open()
        bytes_skipped += item.size - sum(b - a for a, b in gaps)
        todo.append((file, gaps))
    size = part_size or part_size_for(sum(b - a for _, gaps in todo for a, b in gaps), connections)
    parts = [_Part(file, 0, 0) for file, gaps in todo if not gaps]  # only the check and the rename left
    for file, gaps in todo:
        parts += [
            _Part(file, at, min(at + size, end)) for start, end in gaps for at in range(start, end, size)
        ]
    parts.sort(key=lambda p: p.end - p.start, reverse=True)  # largest first: the tail stays short
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    with httpx.Client(headers=headers, limits=limits, timeout=_TIMEOUT, follow_redirects=True) as client:
        run = _Transfer(client, manifest, retries, backoff_s)
        pool = ThreadPoolExecutor(max_workers=connections, thread_name_prefix="transfer")
        futures = []
        try:
            futures = [pool.submit(run.run_part, part) for part in parts]
            wait(futures)
        except BaseException:  # Ctrl-C: the parts stop at their next chunk and record what they wrote
            run.stop.set()
            raise
        finally:
            pool.shutdown(wait=True)
    errors = [exc for exc in (f.exception() for f in futures) if exc is not None]
    if errors:
        more = f" (and {len(errors) - 1} more failures)" if len(errors) > 1 else ""
        raise DownloadError(f"{errors[0]}{more}") from errors[0]
    stats = run.stats
    stats.files_skipped, stats.bytes_skipped = files_skipped, bytes_skipped
    stats.seconds = time.monotonic() - started
    return stats
