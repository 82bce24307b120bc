"""What the fake Hub stores: content-addressed blobs on disk, and repos as lists of commits.

No HTTP here. A commit holds the whole file table of its revision (path -> `Blob`), so any past commit
can be served by sha, as `snapshot_download` does after resolving "main". Blob bytes live under
`<home>/blobs/<sha256>`, never in memory, so a seeded model may be hundreds of megabytes.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import secrets
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_TYPES = ("model", "dataset", "space")
URL_PREFIXES = {"model": "", "dataset": "datasets/", "space": "spaces/"}
# The Hub stores a file with git LFS when it is large or binary, or when .gitattributes says so.
LFS_THRESHOLD_BYTES = 10 * 1024 * 1024
_LFS_EXTENSIONS = "bin safetensors pt pth ckpt h5 onnx gguf npy npz pkl parquet arrow tar zip gz msgpack"
LFS_PATTERNS = tuple(f"*.{ext}" for ext in _LFS_EXTENSIONS.split(" "))
GITATTRIBUTES = "".join(f"{pattern} filter=lfs diff=lfs merge=lfs -text\n" for pattern in LFS_PATTERNS)
_COPY_CHUNK = 1024 * 1024


def iso_time(timestamp: float) -> str:
    """A timestamp in the Hub's date format ('2024-01-31T12:00:00.000Z')."""
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(timestamp))


def git_blob_oid(data: bytes) -> str:
    """The git object id (sha1) of a blob, as `git hash-object` computes it."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git LFS pointer file that git stores in place of a large file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def wants_lfs(path: str, size: int, sample: bytes) -> bool:
    """The Hub's rule: LFS for big files, binary content (NUL in the first 512 bytes) or an LFS pattern."""
    name = path.rsplit("/", 1)[-1]
    return (
        size >= LFS_THRESHOLD_BYTES
        or b"\0" in sample[:512]
        or any(fnmatch.fnmatch(name, pattern) for pattern in LFS_PATTERNS)
    )


@dataclass(frozen=True)
class Blob:
    """One file's content as a revision references it."""

    sha256: str
    size: int
    lfs: bool
    git_oid: str  # the git blob id: of the content, or of the LFS pointer for LFS files

    @property
    def etag(self) -> str:
        """What the resolve endpoint sends as ETag: the sha256 for LFS files, the git blob id otherwise."""
        return self.sha256 if self.lfs else self.git_oid


@dataclass
class Commit:
    """One commit: its message and the full file table of the revision it creates."""

    oid: str
    message: str
    description: str
    parent: str | None
    files: dict[str, Blob]
    created_at: float = field(default_factory=time.time)


@dataclass
class Repo:
    """A model, dataset or space repo with a single branch, "main"."""

    repo_type: str
    repo_id: str
    private: bool
    commits: list[Commit] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)

    @property
    def head(self) -> Commit:
        """The commit "main" points at (every repo has at least its initial commit)."""
        return self.commits[-1]

    def resolve(self, revision: str) -> Commit | None:
        """The commit for "main" or a full commit sha (None: unknown revision)."""
        if revision == "main":
            return self.head
        return next((c for c in self.commits if c.oid == revision), None)

    def public(self) -> dict[str, Any]:
        """The row /_fake/state shows."""
        return {
            "id": self.repo_id,
            "type": self.repo_type,
            "private": self.private,
            "head": self.head.oid,
            "commits": [
                {"oid": c.oid, "message": c.message, "parent": c.parent, "files": len(c.files)}
                for c in self.commits
            ],
            "files": [
                {"path": path, "size": blob.size, "sha256": blob.sha256, "lfs": blob.lfs}
                for path, blob in sorted(self.head.files.items())
            ],
        }


class BlobStore:
    """Content-addressed file contents under `<home>/blobs`, written atomically."""

    def __init__(self, home: Path) -> None:
        self.root = home / "blobs"
        self.tmp = home / "tmp"
        self.root.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)

    def path(self, sha256: str) -> Path:
        """Where a blob's bytes live (it may not exist)."""
        return self.root / sha256

    def size(self, sha256: str) -> int | None:
        """The stored size of a blob (None if absent)."""
        try:
            return self.path(sha256).stat().st_size
        except FileNotFoundError:
            return None

    def put_bytes(self, data: bytes) -> tuple[str, int]:
        """Store bytes; returns (sha256, size)."""
        return self.put_chunks([data])

    def put_file(self, source: Path) -> tuple[str, int]:
        """Store a local file's bytes without loading it whole; returns (sha256, size)."""
        with source.open("rb") as f:
            return self.put_chunks(iter(lambda: f.read(_COPY_CHUNK), b""))

    def put_chunks(self, chunks: Iterable[bytes]) -> tuple[str, int]:
        """Store a stream of chunks, hashing on the way; returns (sha256, size)."""
        digest = hashlib.sha256()
        size = 0
        tmp = self.tmp / secrets.token_hex(8)
        try:
            with tmp.open("wb") as out:
                for chunk in chunks:
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
            sha256 = digest.hexdigest()
            os.replace(tmp, self.path(sha256))
        finally:
            tmp.unlink(missing_ok=True)
        return sha256, size

    def read(self, sha256: str, start: int, end: int, chunk: int) -> Iterator[bytes]:
        """Bytes [start, end) of a blob, in pieces of at most `chunk` bytes."""
        with self.path(sha256).open("rb") as f:
            f.seek(start)
            left = end - start
            while left > 0:
                piece = f.read(min(chunk, left))
                if not piece:
                    return
                left -= len(piece)
                yield piece

    def describe(self, sha256: str, size: int, lfs: bool) -> Blob:
        """A `Blob` for stored content, with its git id (read from disk for small regular files)."""
        if lfs:
            return Blob(sha256, size, True, git_blob_oid(lfs_pointer(sha256, size)))
        return Blob(sha256, size, False, git_blob_oid(self.path(sha256).read_bytes()))

    def sample(self, sha256: str) -> bytes:
        """The first 512 bytes, which decide LFS vs regular like the preupload sample does."""
        with self.path(sha256).open("rb") as f:
            return f.read(512)


class RepoStore:
    """Every repo of the fake, keyed by (type, id); one lock guards them all."""

    def __init__(self, home: Path) -> None:
        self.blobs = BlobStore(home)
        self.lock = threading.RLock()
        self.repos: dict[tuple[str, str], Repo] = {}

    def get(self, repo_type: str, repo_id: str) -> Repo | None:
        """The repo, or None."""
        with self.lock:
            return self.repos.get((repo_type, repo_id))

    def create(self, repo_type: str, repo_id: str, private: bool) -> tuple[Repo, bool]:
        """(repo, created): a new repo gets an initial commit holding `.gitattributes`, as on the Hub."""
        with self.lock:
            existing = self.repos.get((repo_type, repo_id))
            if existing is not None:
                return existing, False
            sha256, size = self.blobs.put_bytes(GITATTRIBUTES.encode())
            files = {".gitattributes": self.blobs.describe(sha256, size, lfs=False)}
            repo = Repo(repo_type, repo_id, private)
            repo.commits.append(Commit(secrets.token_hex(20), "initial commit", "", None, files))
            self.repos[(repo_type, repo_id)] = repo
            return repo, True

    def delete(self, repo_type: str, repo_id: str) -> bool:
        """Forget a repo (its blobs stay: they may be shared); False if unknown."""
        with self.lock:
            return self.repos.pop((repo_type, repo_id), None) is not None

    def commit(
        self, repo: Repo, message: str, description: str, changes: Iterable[tuple[str, Blob | None]]
    ) -> Commit:
        """Append a commit to "main", applying (path, new blob or None to delete) changes in order.

        A path ending in "/" paired with None deletes that folder.
        """
        with self.lock:
            files = dict(repo.head.files)
            for path, blob in changes:
                if blob is not None:
                    files[path] = blob
                elif path.endswith("/"):
                    files = {p: b for p, b in files.items() if not p.startswith(path)}
                else:
                    files.pop(path, None)
            commit = Commit(secrets.token_hex(20), message, description, repo.head.oid, files)
            repo.commits.append(commit)
            return commit
