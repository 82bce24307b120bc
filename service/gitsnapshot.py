"""A git job's local files: the files its commit tracks, written out into a directory of the fleet's.

The git trigger reads a config as of its commit, and the files that config names (datasets, their
`data_files`, an axolotl job's DeepSpeed JSON) come from that same commit and from nothing else the
repository's directory holds: never `.git` (a clone's config may hold its remote's credential), never an
untracked, ignored or modified file of the working tree. So a look writes out the tree of each commit it
settles a config of, once, into a fresh owner-only directory under `<home>/git-snapshots/`: each blob as
git keeps it (`git cat-file`: no filter, end-of-line conversion or export rule of the committer's
.gitattributes applies), the executable bit kept, a symlink as a symlink (jobs.paths refuses one that leads
out of the snapshot and the data roots), a submodule left out. The job is confined to it
(`Confinement(snapshot, data roots)`), submit copies what the run uses into the run's `ship/`
(jobs.shipping), and the snapshot is removed when the look is done with the commit.

A commit tracking more than SNAPSHOT_LIMIT_BYTES or SNAPSHOT_LIMIT_FILES, or a path git itself would not
check out (`.git`, `..`, an empty name), is refused before anything is written; one whose tree cannot be
written as it says (one name twice, a link's target with a NUL byte, a name too long) is refused as it is
written, and what was written is removed. Either way (TreeRefused) each of its configs is invalid, for
good, as its content is. The fleet's own trouble (a full disk) is a GitError: the look fails, nothing is
marked, and the next look tries again.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from core.errors import ConfigError, FleetError, GitError
from service.gitrepo import EXECUTABLE_MODE, LINK_MODE, SUBMODULE_MODE, GitRepo, TreeEntry

SNAPSHOTS_DIR = "git-snapshots"  # under the fleet's home
SNAPSHOT_LIMIT_BYTES = 1024 * 1024 * 1024
SNAPSHOT_LIMIT_FILES = 100_000
STALE_S = 24 * 3600  # a snapshot left this long by a process that died is removed by the next one made
# Errors of the fleet's machine, not of the commit: the look fails and is tried again.
_MACHINE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.ENOMEM, errno.EMFILE,
                             errno.ENFILE, errno.EACCES, errno.EPERM})  # fmt: skip


class TreeRefused(FleetError):
    """A commit whose tracked files the fleet does not write out: too many, too big, or a path git refuses."""


class Snapshot:
    """The tracked files of one commit, written when first asked for (a look whose configs at that commit
    are all settled already writes nothing) and removed on leaving the `with`."""

    def __init__(self, repo: GitRepo, commit: str, home: Path) -> None:
        self.repo, self.commit, self.parent = repo, commit, home / SNAPSHOTS_DIR
        self._root: Path | None = None
        self._refused: TreeRefused | None = None

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()

    def root(self) -> Path:
        """The snapshot's directory (absolute, links resolved), written now if it is not yet. TreeRefused,
        the same each time, for a commit it does not write; GitError when git or the disk fails."""
        if self._refused is not None:
            raise self._refused
        if self._root is None:
            try:
                self._root = self._write()
            except TreeRefused as exc:
                self._refused = exc
                raise
        return self._root

    def shown(self, error: ConfigError, lines: Mapping[str, int] | None = None) -> ConfigError:
        """`error` with the snapshot's directory written as git names a commit's tree (`abc1234:tasks`):
        what the committer knows, not where the fleet keeps its files; a problem without a line (found
        at submit) gets its key's from `lines`."""
        root, short = self._root, self.commit[:7]
        problems = [
            dataclasses.replace(
                p,
                message=_as_git(p.message, str(root), short) if root is not None else p.message,
                line=p.line or (lines or {}).get(p.path),
            )
            for p in error.problems
        ]
        return ConfigError(error.source, problems)

    def remove(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def _write(self) -> Path:
        entries = [e for e in self.repo.tree(self.commit) if e.mode != SUBMODULE_MODE]
        _check(entries, self.commit[:7])
        try:
            self.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            _remove_stale(self.parent)
            root = Path(tempfile.mkdtemp(prefix=f"{self.commit[:12]}-", dir=self.parent)).resolve()
        except OSError as exc:
            raise GitError(f"cannot make a snapshot in {self.parent}: {exc.strerror or exc}") from None
        try:
            _write_tree(self.repo, root, entries)
        except OSError as exc:
            shutil.rmtree(root, ignore_errors=True)
            named = exc.filename2 or exc.filename  # (a link's own path, else the file's)
            where = os.fsdecode(named).removeprefix(f"{root}/")[:80] if named else ""
            if exc.errno in _MACHINE_ERRNOS:
                raise GitError(
                    f"cannot write the files of commit {self.commit[:7]} in {self.parent}: {exc.strerror}"
                ) from None
            raise TreeRefused(
                f"the files of commit {self.commit[:7]} cannot be written out: {where}: {exc.strerror or exc}"
            ) from None
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return root


def _as_git(message: str, root: str, short: str) -> str:
    """`message` with `root` (and a path in it) written `short:path`; also a path that a message cut short
    (jobs.problems.shorten: "/home/u/.../git-snaps...") within the snapshot's own name."""
    message = message.replace(f"{root}/", f"{short}:").replace(root, f"{short}:")
    for cut in range(len(root) - 1, 15, -1):
        message = message.replace(f"{root[:cut]}...", f"{short}:...")
    return message


def _check(entries: list[TreeEntry], short: str) -> None:
    """Refuse (TreeRefused) a tree over the limits or with a path git itself would not check out."""
    total = sum(e.size for e in entries)
    if total > SNAPSHOT_LIMIT_BYTES or len(entries) > SNAPSHOT_LIMIT_FILES:
        raise TreeRefused(
            f"commit {short} tracks {len(entries)} files of {_amount(total)}; a git job's local files are "
            f"written out from its commit, which may track at most {SNAPSHOT_LIMIT_FILES} files of "
            f"{_amount(SNAPSHOT_LIMIT_BYTES)}: keep large datasets on the HF Hub (by id) or under "
            "FLEET_DATA_ROOTS"
        )
    for entry in entries:
        parts = entry.path.split(b"/")
        if any(p in (b"", b".", b"..") or p.lower() == b".git" for p in parts):
            shown = os.fsdecode(entry.path)[:80]
            raise TreeRefused(f"commit {short} tracks {shown!r}, a path git itself does not check out")


def _amount(size: int) -> str:
    return f"{size / 2**20:.0f} MiB" if size >= 2**20 else f"{size} bytes"


def _write_tree(repo: GitRepo, root: Path, entries: list[TreeEntry]) -> None:
    """Write each entry under `root`: files created anew (never through a link, never over anything),
    directories made here (a name already taken by a link or file is refused), symlinks as symlinks."""
    top = os.fsencode(root)
    made: set[bytes] = set()
    with repo.blobs() as blobs:
        for entry in entries:
            parts = entry.path.split(b"/")
            for depth in range(1, len(parts)):
                folder = b"/".join(parts[:depth])
                if folder not in made:
                    _directory(top + b"/" + folder)
                    made.add(folder)
            target = top + b"/" + entry.path
            if entry.mode == LINK_MODE:
                chunks: list[bytes] = []
                blobs.read_into(entry.sha, chunks.append)
                link = b"".join(chunks)
                if b"\0" in link:  # (os.symlink would raise ValueError)
                    raise OSError(errno.EINVAL, "a link whose target holds a NUL byte", target)
                os.symlink(link, target)
                continue
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            fd = os.open(target, flags, 0o700 if entry.mode == EXECUTABLE_MODE else 0o600)
            with os.fdopen(fd, "wb") as out:
                blobs.read_into(entry.sha, out.write)


def _directory(path: bytes) -> None:
    """Make the directory `path`, or accept it when it is one already (not a link to one)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if not os.path.isdir(path) or os.path.islink(path):
            raise OSError(errno.ENOTDIR, "a name the tree holds twice", path) from None


def _remove_stale(parent: Path) -> None:
    """Remove snapshots older than STALE_S: those of a process that died before removing its own."""
    now = time.time()
    with os.scandir(parent) as entries:
        for entry in entries:
            try:
                old = now - entry.stat(follow_symlinks=False).st_mtime > STALE_S
                if old and entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
            except OSError:
                continue
