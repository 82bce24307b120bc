"""Reading a git repository through the `git` command: commits, the configs they touch, file contents.

Plain functions over subprocess `git` (no library). Every git failure becomes a `GitError` with git's own
message; nothing here writes to the repository (`fetch` only updates remote-tracking refs).
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

from core.errors import GitError

ZERO_SHA = re.compile(r"0{40}|0{64}")  # GitHub's `before` for a new branch
_SCP_LIKE = re.compile(r"^(?:[^@/]+@)?(?P<host>[^:/]+):(?P<path>[^/].*)$")  # git@github.com:o/r.git
GIT_TIMEOUT_S = 120.0
LINK_MODE, SUBMODULE_MODE, EXECUTABLE_MODE = "120000", "160000", "100755"  # a tree entry's modes
_CHUNK = 1 << 20


def glob_match(path: str, pattern: str) -> bool:
    """Whether a repository path (``a/b/c.yml``) matches a glob, segment by segment.

    ``**`` as a whole segment matches zero or more segments; ``*``, ``?`` and ``[...]`` match within one
    segment only (never across ``/``), case-sensitively, as in .gitignore and GitHub's path filters.
    So ``tasks/**/*.yml`` matches ``tasks/a.yml`` and ``tasks/x/y/a.yml`` but not ``tasks.yml``.
    """
    pats: list[str] = []
    for segment in pattern.strip("/").split("/"):
        if not (segment == "**" and pats and pats[-1] == "**"):  # a/**/**/b is a/**/b
            pats.append(segment)
    return _match(tuple(path.split("/")), tuple(pats))


def _match(parts: tuple[str, ...], pats: tuple[str, ...]) -> bool:
    if not pats:
        return not parts
    head, rest = pats[0], pats[1:]
    if head == "**":
        return any(_match(parts[i:], rest) for i in range(len(parts) + 1))
    return bool(parts) and fnmatchcase(parts[0], head) and _match(parts[1:], rest)


def repo_id_of_url(url: str) -> str:
    """A remote URL as ``host/owner/name``: no scheme, user, password, port or ``.git``.

    Two clones of one repository (https on a CI runner, ssh on the fleet's machine) get the same id, and
    no credential that a URL may carry (``https://user:token@host/...``) is ever kept.
    """
    url = url.strip()
    if "://" in url:
        parts = urlsplit(url)
        host, path = parts.hostname or "", parts.path
    elif match := _SCP_LIKE.match(url):
        host, path = match["host"], match["path"]
    else:  # a local path used as a remote
        return str(Path(url).expanduser().absolute())
    path = path.strip("/").removesuffix(".git")
    return f"{host.lower()}/{path}" if host else path


@dataclass(frozen=True)
class TreeEntry:
    """One file of a commit's tree, as `git ls-tree -r` lists it."""

    mode: str  # 100644, 100755 (executable), 120000 (a symlink: the blob is its target), 160000 (submodule)
    sha: str  # the blob's (a submodule's: its commit's)
    size: int  # the blob's bytes; 0 for a submodule
    path: bytes  # as git keeps it, '/'-separated, never decoded


@dataclass(frozen=True)
class GitRepo:
    """A repository's working tree (`root` is its top level)."""

    root: Path

    @classmethod
    def open(cls, path: Path) -> GitRepo:
        """The repository that holds `path`; GitError when it is none (or git is missing)."""
        if not path.is_dir():
            raise GitError(f"{path} is not a directory")
        try:
            top = _git(path, "rev-parse", "--show-toplevel").strip()
        except GitError as exc:
            raise GitError(f"{path} is not in a git repository ({exc})") from None
        if not top:  # a bare repository: no working tree to find datasets in
            raise GitError(f"{path} has no working tree (a bare repository)")
        return cls(Path(top))

    def git(self, *args: str) -> str:
        return _git(self.root, *args)

    def commit(self, ref: str) -> str | None:
        """The full sha of the commit `ref` names, or None when there is none."""
        if ZERO_SHA.fullmatch(ref):
            return None
        try:
            return self.git(
                "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"
            ).strip()
        except GitError:
            return None

    def is_ancestor(self, older: str, newer: str) -> bool:
        """Whether `older` is `newer` or one of its ancestors (False also when `older` is unknown here)."""
        return _run(self.root, "merge-base", "--is-ancestor", older, newer).returncode == 0

    def first_parent_commits(self, start: str, head: str) -> list[str]:
        """The commits after `start` up to `head` along first parents, oldest first."""
        return self.git("rev-list", "--reverse", "--first-parent", f"{start}..{head}").split()

    def changed_files(self, old: str | None, new: str, globs: list[str]) -> list[str]:
        """The files that `new` added, modified or renamed to, compared with `old` (its first parent for a
        watched commit; None for a root commit), that match any of `globs`; in git's order."""
        base = ["diff-tree", "-r", "-z", "-M", "--name-only", "--diff-filter=AMR", "--no-commit-id"]
        out = self.git(*base, "--root", new) if old is None else self.git(*base, old, new)
        return [p for p in out.split("\0") if p and any(glob_match(p, g) for g in globs)]

    def first_parent(self, commit: str) -> str | None:
        parents = self.git("rev-list", "--parents", "-n", "1", commit).split()[1:]
        return parents[0] if parents else None

    def size(self, commit: str, path: str) -> int:
        """The size in bytes of the file at `path` as of `commit`."""
        return int(self.git("cat-file", "-s", f"{commit}:{path}"))

    def read(self, commit: str, path: str) -> bytes:
        """The file's bytes as of `commit`."""
        return _git_bytes(self.root, "cat-file", "blob", f"{commit}:{path}")

    def tree(self, commit: str) -> list[TreeEntry]:
        """Every file the commit tracks (symlinks and submodules included), in git's order."""
        out = _git_bytes(self.root, "ls-tree", "-r", "-l", "-z", "--full-tree", commit)
        entries = []
        for record in out.split(b"\0"):
            if not record:
                continue
            meta, _, path = record.partition(b"\t")
            mode, _kind, sha, size = meta.decode().split()
            entries.append(TreeEntry(mode, sha, 0 if size == "-" else int(size), path))
        return entries

    def blobs(self, timeout_s: float = GIT_TIMEOUT_S) -> Blobs:
        """A reader of this repository's blobs by sha (one `git cat-file --batch` for all of them), to use
        in a `with`; it is killed after `timeout_s`."""
        return Blobs(self.root, timeout_s)

    def branch(self) -> str | None:
        """The checked-out branch's name, None on a detached HEAD."""
        try:
            return self.git("symbolic-ref", "--quiet", "--short", "HEAD").strip() or None
        except GitError:
            return None

    def repo_id(self, remote: str = "origin") -> str:
        """What names this repository in the fleet's keys and in a run's origin: its `remote`'s URL as
        `repo_id_of_url` gives it, else (no such remote) the working tree's absolute path."""
        try:
            url = self.git("remote", "get-url", "--", remote).strip()
        except GitError:
            return str(self.root)
        return repo_id_of_url(url) if url else str(self.root)

    def fetch(self, remote: str = "origin") -> None:
        self.git("fetch", "--quiet", "--no-tags", "--", remote)


class Blobs:
    """`git cat-file --batch`: blobs read one after the other from one process, each passed on in chunks
    as git stores it (no filter, end-of-line conversion or other attribute of the tree applies)."""

    def __init__(self, root: Path, timeout_s: float) -> None:
        self.root, self.timeout_s = root, timeout_s
        try:
            self._proc = subprocess.Popen(
                ["git", "-C", str(root), "cat-file", "--batch"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=_env(),
            )
        except FileNotFoundError:
            raise GitError("git is not installed (no `git` on PATH)") from None
        self._timer = threading.Timer(timeout_s, self._proc.kill)
        self._timer.start()

    def __enter__(self) -> Blobs:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._timer.cancel()
        self._proc.kill()
        self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                stream.close()

    def read_into(self, sha: str, sink: Callable[[bytes], object]) -> None:
        """Pass the blob `sha`'s bytes to `sink`, in chunks of at most 1 MiB. GitError when it is no blob
        here, or git stopped (killed after the timeout)."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        stdout = self._proc.stdout
        try:
            self._proc.stdin.write(sha.encode() + b"\n")
            self._proc.stdin.flush()
        except OSError:
            raise self._stopped() from None
        header = stdout.readline().split()
        if not header:
            raise self._stopped()
        if len(header) != 3 or header[1] != b"blob":
            raise GitError(f"git cat-file in {self.root}: {sha} is no blob")
        left = int(header[2])
        while left:
            chunk = stdout.read(min(left, _CHUNK))
            if not chunk:
                raise self._stopped()
            sink(chunk)
            left -= len(chunk)
        if stdout.read(1) != b"\n":
            raise self._stopped()

    def _stopped(self) -> GitError:
        if not self._timer.is_alive() and self._proc.poll() is not None:
            return GitError(f"git cat-file took more than {self.timeout_s:.0f} s")
        return GitError(f"git cat-file in {self.root} stopped (exit {self._proc.poll()})")


def _env() -> dict[str, str]:
    # Never prompt for a password (a watcher has no terminal); messages in English for the error text.
    return {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    command = ["git", "-C", str(cwd), *args]
    try:
        return subprocess.run(command, capture_output=True, env=_env(), timeout=GIT_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise GitError("git is not installed (no `git` on PATH)") from None
    except subprocess.TimeoutExpired:
        raise GitError(f"git {args[0]} took more than {GIT_TIMEOUT_S:.0f} s") from None


def _git_bytes(cwd: Path, *args: str) -> bytes:
    done = _run(cwd, *args)
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip().splitlines()
        raise GitError(f"git {args[0]} in {cwd}: {message[-1] if message else f'exit {done.returncode}'}")
    return done.stdout


def _git(cwd: Path, *args: str) -> str:
    return _git_bytes(cwd, *args).decode(errors="surrogateescape")
