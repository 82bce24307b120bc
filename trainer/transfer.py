"""Fetch a set of files over HTTP on many connections at once, large files split into byte ranges.

One connection to a CDN carries far less than a node's link, and a model is often one big safetensors
file, so parallel *files* are not enough: every file is cut into parts (`Range` requests), and one pool of
`connections` threads sharing one httpx connection pool fetches the parts of all files, largest first,
each written at its offset into a preallocated partial file. Small files are one part, one request.

Resumable, at three levels, all under ``<dest>/.trainfleet/`` (trainer.transfer_state holds that state):
- A file being filled keeps a sidecar of the byte ranges on disk. A range is recorded when a part
  finishes, and also when a part is cut short (its own failure, or another part's stopping the rest), so a
  later run asks only for the missing bytes, whatever its part size.
- A retried part (within a run) resumes from the last byte it wrote.
- A finished file is verified and renamed into place, and recorded in the manifest; a re-run skips it.

A failed part is retried with exponential back-off (a 429's Retry-After is honoured); past `retries`
attempts the transfer stops and raises DownloadError. Bytes written survive a killed process (they are
in the page cache); a machine crash that loses some is caught by the digest check.
"""

from __future__ import annotations

import email.utils
import math
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import httpx

from trainer.errors import DownloadError
from trainer.transfer_state import MIB, Item, Manifest, PartialFile, Span

MIN_PART_BYTES = 1 * MIB
MAX_PART_BYTES = 64 * MIB
PARTS_PER_CONNECTION = 4  # a few parts per connection, so the last round leaves few connections idle
DEFAULT_RETRIES = 5
MAX_BACKOFF_S = 10.0
MAX_RETRY_AFTER_S = 60.0
_TIMEOUT = httpx.Timeout(30.0, connect=10.0)


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


@dataclass(frozen=True)
class _Part:
    """Bytes [start, end) of one file; start == end for a file with nothing left to fetch but the check."""

    file: PartialFile
    start: int
    end: int


class _Transfer:
    """One run of `transfer`: the shared client, the stop flag and the counters."""

    def __init__(self, client: httpx.Client, manifest: Manifest, retries: int, backoff_s: float) -> None:
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

    def _record(self, file: PartialFile, span: Span) -> None:
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
    meta: Mapping[str, str] | None = None,
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
    manifest = Manifest(dest, meta or {})
    todo: list[tuple[PartialFile, list[Span]]] = []
    files_skipped = bytes_skipped = 0
    for item in items:
        if manifest.has(item, dest):
            files_skipped += 1
            bytes_skipped += item.size
            continue
        file = PartialFile(item, dest)
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
