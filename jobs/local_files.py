"""The local files a job file names, found and confined before anything else reads them: dataset paths
(made absolute; a hub id kept as written), a dataset's `data_files`, axolotl's `path: json` + `data_files`
form, and an axolotl job's local `deepspeed:` JSON. Each function edits the raw job mapping in place and
returns its problems, with the key path and line (jobs.spec calls them; jobs.paths says what is allowed).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from core.errors import Problem
from jobs.paths import Confinement, PathRefused, escapes, is_system, lexical
from jobs.problems import shorten
from jobs.sections import ProviderName
from jobs.yamlsafe import join_path
from trainer.config import HUB_ID_PATTERN
from trainer.rows import BUILDERS

# A dataset path with one of these suffixes is a file, never a hub id.
DATA_SUFFIXES = frozenset(
    {".json", ".jsonl", ".csv", ".tsv", ".parquet", ".arrow", ".txt", ".gz", ".bz2", ".xz", ".zst", ".zip"}
)


def resolve_datasets(
    raw: dict[str, Any], lines: Mapping[str, int], base_dir: Path, paths: Confinement
) -> list[Problem]:
    """Make local dataset paths absolute in `raw` once `paths` allows them and their `data_files`; keep hub
    ids; report paths that are neither, or that the rule refuses."""
    datasets = raw.get("datasets")
    if not isinstance(datasets, list):
        return []
    problems = []
    resolved: list[Any] = []
    for i, entry in enumerate(datasets):
        path = entry.get("path") if isinstance(entry, dict) else None
        if isinstance(path, str) and path in BUILDERS and entry.get("data_files") is not None:
            entry, found = _builder_files(entry, join_path("datasets", i), lines, base_dir, paths)
            problems += found
        elif isinstance(path, str) and path:
            where = join_path(join_path("datasets", i), "path")
            try:
                new_path = _dataset_path(path, base_dir, paths)
            except PathRefused as exc:
                problems.append(Problem(where, str(exc), lines.get(where)))
                new_path = path
            if new_path is None:
                message = f"file not found: {shorten(path)} (relative paths are looked up in {base_dir})"
                problems.append(Problem(where, message, lines.get(where)))
            else:
                entry = {**entry, "path": new_path}
                problems += _data_files(entry, join_path("datasets", i), lines, paths)
        resolved.append(entry)
    raw["datasets"] = resolved
    return problems


def _builder_files(
    entry: dict[str, Any], at: str, lines: Mapping[str, int], base_dir: Path, paths: Confinement
) -> tuple[dict[str, Any], list[Problem]]:
    """axolotl's `path: json` (csv, parquet, ...) form: its `data_files` are local files relative to the job
    file, each one `paths` allows, made absolute (they travel with the job: jobs.shipping)."""
    value = entry["data_files"]
    named = [(join_path(at, "data_files"), value)] if isinstance(value, str) else []
    if isinstance(value, list):
        named = [(join_path(join_path(at, "data_files"), j), v) for j, v in enumerate(value)]
    problems, resolved = [], []
    for where, name in named:
        if not isinstance(name, str) or not name:
            problems.append(Problem(where, "must be a file name", lines.get(where)))
            continue
        candidate = lexical(Path(name), base_dir)
        try:
            if not paths.allows(candidate):
                raise paths.outside(candidate, shorten(name))
            if not os.path.lexists(candidate):
                raise PathRefused(
                    f"file not found: {shorten(name)} (relative paths are looked up in {base_dir})"
                )
            resolved.append(str(paths.check(candidate, shorten(name), directory=False)))
        except PathRefused as exc:
            problems.append(Problem(where, str(exc), lines.get(where)))
    if not problems and named:
        entry = {**entry, "data_files": resolved if isinstance(value, list) else resolved[0]}
    return entry, problems


def _data_files(
    entry: dict[str, Any], at: str, lines: Mapping[str, int], paths: Confinement
) -> list[Problem]:
    """A dataset's `data_files` name files inside its directory: relative, never climbing out; for a local
    directory each must be a regular file `paths` allows."""
    value = entry.get("data_files")
    named = [(join_path(at, "data_files"), value)] if isinstance(value, str) else []
    if isinstance(value, list):
        named = [
            (join_path(join_path(at, "data_files"), j), v) for j, v in enumerate(value) if isinstance(v, str)
        ]
    root = Path(entry["path"])
    problems = []
    for where, name in named:
        try:
            if escapes(name):
                raise PathRefused(f"{shorten(name)}: data_files name files inside the dataset's directory")
            if root.is_absolute() and root.is_dir():
                candidate = lexical(Path(name), root)
                if not os.path.lexists(candidate):
                    raise PathRefused(f"file not found: {shorten(name)} in {shorten(entry['path'])}")
                paths.check(candidate, shorten(name), directory=False)
        except PathRefused as exc:
            problems.append(Problem(where, str(exc), lines.get(where)))
    return problems


def resolve_deepspeed(
    raw: dict[str, Any], lines: Mapping[str, int], base_dir: Path, paths: Confinement, provider: ProviderName
) -> list[Problem]:
    """An axolotl `deepspeed:` JSON named by a relative path (or an absolute one `paths` allows) is a local
    file, made absolute (it travels with the job); another absolute one is a rented node's (an image's own
    configs), which a local node, being this machine, may not read."""
    value = raw.get("deepspeed")
    if not isinstance(value, str) or not value:
        return []
    candidate = lexical(Path(value), base_dir)
    absolute = Path(value).is_absolute()
    try:
        if not paths.allows(candidate):
            if absolute and provider != ProviderName.LOCAL and not is_system(candidate):
                return []  # the rented node's own file: never read here, never shipped (jobs.shipping)
            raise paths.outside(candidate, shorten(value))
        if os.path.lexists(candidate):
            real = paths.check(candidate, shorten(value), directory=False)
            raw["deepspeed"] = value if absolute else str(real)
            return []
    except PathRefused as exc:
        return [Problem("deepspeed", str(exc), lines.get("deepspeed"))]
    message = (
        f"file not found: {shorten(value)} (relative paths are looked up in {base_dir}; "
        "`axolotl fetch deepspeed_configs` puts axolotl's there)"
    )
    return [Problem("deepspeed", message, lines.get("deepspeed"))]


def _dataset_path(path: str, base_dir: Path, paths: Confinement) -> str | None:
    """The local path (checked by `paths`), the hub id as written, or None when neither is found. Raises
    PathRefused for a local path the rule does not allow."""
    written = Path(path)
    candidate = lexical(written, base_dir)
    if paths.allows(candidate) and _exists(candidate):
        paths.check(candidate, shorten(path))
        return path if written.is_absolute() else str(candidate.resolve())
    if re.fullmatch(HUB_ID_PATTERN, path) and PurePosixPath(path).suffix.lower() not in DATA_SUFFIXES:
        return path  # a hub dataset id, fetched where the job runs
    if not paths.allows(candidate):
        raise paths.outside(candidate, shorten(path))
    return None


def _exists(path: Path) -> bool:
    try:
        return os.path.lexists(path)
    except (OSError, ValueError):  # e.g. a name too long, a NUL: not a file we can use
        return False
