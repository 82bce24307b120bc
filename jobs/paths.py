"""Where the local files a job names may be: one rule for datasets, their `data_files` and a DeepSpeed JSON.

A job comes from someone the fleet trusts less than itself (a Discord user, a git committer), yet the fleet
reads the files it names and, for a rented node, copies them to a machine whose `entry` and image the job
controls. So a local path is allowed only when, after every symlink, it is a regular file (or a directory
holding only regular files and directories) under the job's own directory or under a data root the
operator listed (`FLEET_DATA_ROOTS`), and never under /proc, /dev or /sys, whatever the roots say.

The check is lexical first: a path written outside those places is refused without looking at the disk,
so an error never tells whether a file exists there. Then the resolved path is checked: a link that leads
out is refused too.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SYSTEM_DIRS = (Path("/proc"), Path("/dev"), Path("/sys"))
"""Never read, even under a data root: their "files" are the fleet process's own state and devices."""


class PathRefused(Exception):
    """A local path the rule does not allow; the message says why, for a person."""


def _under(path: Path, places: Iterable[Path]) -> bool:
    return any(path == place or place in path.parents for place in places)


def is_system(path: Path) -> bool:
    """Whether `path` (absolute) is under /proc, /dev or /sys."""
    return _under(path, SYSTEM_DIRS)


def lexical(path: Path, base_dir: Path) -> Path:
    """`path` made absolute against `base_dir` and normalised ('..' taken out) without touching the disk."""
    return Path(os.path.normpath(base_dir / path))


def escapes(name: str) -> bool:
    """Whether a name meant to be inside a directory (a `data_files` entry) is absolute or climbs out."""
    normal = os.path.normpath(name)
    return os.path.isabs(name) or normal == ".." or normal.startswith(("../", "/"))


@dataclass(frozen=True)
class Confinement:
    """The places a job's local files may be: `trusted` (the job file's directory; for a git job, the
    snapshot of its commit's tracked files, service.gitsnapshot; None for a Discord attachment, which has
    no directory of its own) and the operator's data roots."""

    trusted: Path | None
    roots: tuple[Path, ...] = ()

    def _written(self) -> list[Path]:
        places = ([self.trusted] if self.trusted is not None else []) + list(self.roots)
        return [Path(os.path.abspath(p)) for p in places]

    def _real(self) -> list[Path]:
        return [p.resolve() for p in self._written()]

    def allows(self, path: Path) -> bool:
        """Whether the absolute, normalised `path` is written inside one of the places (no disk access)."""
        return not is_system(path) and _under(path, self._written() + self._real())

    def outside(self, path: Path, shown: str) -> PathRefused:
        """The refusal of `path` (written `shown`), outside every place, saying which places there are."""
        roots = ", ".join(str(r) for r in self.roots) or "none set"
        if is_system(path):
            return PathRefused(f"{shown}: files under /proc, /dev and /sys are never read")
        if self.trusted is None:
            where = f"the data roots (FLEET_DATA_ROOTS: {roots}); an attached job has no directory of its own"
        else:
            where = f"the job's directory ({self.trusted}) and the data roots (FLEET_DATA_ROOTS: {roots})"
        return PathRefused(f"{shown} is outside {where}")

    def check(self, path: Path, shown: str, *, directory: bool = True) -> Path:
        """The real path of `path` (absolute, normalised, written inside a place and present on disk) once
        it, and for a directory everything in it, resolves inside a place to regular files (a directory
        only where `directory`). Raises PathRefused saying why."""
        if not self.allows(path):
            raise self.outside(path, shown)
        real = self._resolve(path, shown)
        mode = os.stat(real).st_mode
        if stat.S_ISDIR(mode) and directory:
            self._check_tree(real, shown)
        elif not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO, device or socket"
            raise PathRefused(f"{shown} is {kind}, not a regular file")
        return real

    def _resolve(self, path: Path, shown: str) -> Path:
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError, ValueError):
            raise PathRefused(f"{shown}: cannot be resolved (missing, or a broken or looping link)") from None
        if is_system(real) or not _under(real, self._real()):
            # The target is not named: it is outside what this job may see.
            raise PathRefused(f"{shown} is a link that leads outside the job's directory and the data roots")
        return real

    def _check_tree(self, top: Path, shown: str) -> None:
        """Every entry under `top`, links followed (each inside a place), is a directory or a regular file."""
        seen: set[Path] = set()
        stack = [top]
        while stack:
            folder = stack.pop()
            if folder in seen:
                continue
            seen.add(folder)
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError as exc:
                raise PathRefused(f"{shown}: cannot list {folder.name}: {exc.strerror or exc}") from None
            for entry in entries:
                inner = f"{shown} (its {entry.name!r})"
                real = self._resolve(Path(entry.path), inner) if entry.is_symlink() else Path(entry.path)
                mode = os.stat(real).st_mode
                if stat.S_ISDIR(mode):
                    stack.append(real)
                elif not stat.S_ISREG(mode):
                    raise PathRefused(f"{inner} is a FIFO, device or socket, not a regular file")


NODE_PATH_KEYS = (
    "base_model",
    "base_model_config",
    "tokenizer_config",
    "lora_model_dir",
    "resume_from_checkpoint",
    "chat_template_jinja",
    "dataset_prepared_path",
)
"""Keys a trainer reads (dataset_prepared_path: writes) as a path where the job runs, besides the datasets
and `deepspeed` (checked with their files). On the local provider that is this machine."""


def node_paths(config: object) -> tuple[Path, ...]:
    """The absolute paths a training config names under NODE_PATH_KEYS: what a local node reads (or, for
    dataset_prepared_path, writes) in place, on this machine."""
    found = [getattr(config, key, None) for key in NODE_PATH_KEYS]
    extra = getattr(config, "model_extra", None) or {}
    found += [extra.get(key) for key in NODE_PATH_KEYS]
    return tuple(dict.fromkeys(Path(v) for v in found if isinstance(v, str) and os.path.isabs(v)))


def local_node_refusal(value: object, paths: Confinement) -> str | None:
    """Why a local node may not take `value` (of one of NODE_PATH_KEYS) as a path, or None. A hub id or a
    name inside the node's working directory passes; `~`, a climb out of it, and an absolute path outside
    the job's places (after links) do not."""
    if not isinstance(value, str) or not value:
        return None
    shown = value if len(value) <= 80 else f"{value[:77]}..."
    if value.startswith("~"):
        return f"{shown}: a path in the fleet's home directory is not the job's"
    if not os.path.isabs(value):
        return f"{shown}: climbs out of the job's working directory" if escapes(value) else None
    path = lexical(Path(value), Path("/"))
    try:
        if not paths.allows(path):
            raise paths.outside(path, shown)
        if os.path.lexists(path):
            paths.check(path, shown)
    except PathRefused as exc:
        return str(exc)
    return None
