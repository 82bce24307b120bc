"""The rows of one data file, whatever its format: JSON Lines, JSON, CSV, Parquet or Arrow.

JSON Lines (`.jsonl`, and a file of an unknown suffix, as the recipe always read it) is read here, line
by line: the fast path, with line numbers in errors. The other formats go through `datasets.load_dataset`
with its packaged builders (json, csv, parquet, arrow) in streaming mode, so rows are read in batches
straight from the file and nothing is converted into a cache; the lock files the library still writes go
into `cache_dir`, by default a temporary directory removed afterwards (never the home's
~/.cache/huggingface). `limit` stops after that many rows (the validate-time check reads a bounded head).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer.errors import DatasetError

# Suffix -> the `datasets` builder that reads it; `path: <builder>` + data_files names one directly.
FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}
BUILDERS = frozenset(FORMATS.values())
SAVED_MARKERS = ("state.json", "dataset_info.json")  # a directory written by Dataset.save_to_disk


def builder_of(path: Path, forced: str | None = None) -> str | None:
    """The builder for `path`: `forced` (a `path: json` entry's), else by suffix; None: JSON Lines."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl" and forced in (None, "json"):
        return None
    return forced if forced is not None else FORMATS.get(suffix)


def data_files_in(folder: Path) -> list[Path]:
    """The data files directly in `folder`, by name: those of a known format; only the .arrow files of a
    directory that Dataset.save_to_disk wrote (its JSON files describe it and are not data)."""
    saved = all((folder / name).is_file() for name in SAVED_MARKERS)
    suffixes = {".arrow"} if saved else set(FORMATS)
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in suffixes)


def read_rows(
    path: Path,
    builder: str | None = None,
    *,
    limit: int | None = None,
    cache_dir: Path | None = None,
    shown: str | None = None,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (where, row) for each row of `path`, at most `limit` rows; `where` names it for errors:
    "row 3 of <shown>" ("row 3 (line 4) of ..." in JSON Lines; `shown` defaults to the path). Raises
    DatasetError for a file that cannot be read or parsed."""
    name = shown or str(path)
    if builder is None:
        for row, (line, obj) in enumerate(read_jsonl(path, limit, name), start=1):
            yield (f"row {row} of {name}" if row == line else f"row {row} (line {line}) of {name}"), obj
        return
    if cache_dir is not None:
        for row, obj in _streamed(path, builder, limit, cache_dir, name):
            yield f"row {row} of {name}", obj
        return
    with tempfile.TemporaryDirectory(prefix="trainfleet-datasets-") as tmp:
        for row, obj in _streamed(path, builder, limit, Path(tmp), name):
            yield f"row {row} of {name}", obj


def read_jsonl(
    path: Path, limit: int | None = None, shown: str | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) for every non-blank line; a line that is not a JSON object is an error
    (naming the file as `shown`, default its path)."""
    name = shown or str(path)
    count = 0
    try:
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if limit is not None and count >= limit:
                    return
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DatasetError(f"{name}:{number}: not valid JSON: {exc.msg}") from exc
                if not isinstance(obj, dict):
                    raise DatasetError(f"{name}:{number}: expected a JSON object, got {type(obj).__name__}")
                count += 1
                yield number, obj
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{name}: cannot read: {exc}") from exc


def _streamed(
    path: Path, builder: str, limit: int | None, cache_dir: Path, name: str
) -> Iterator[tuple[int, dict[str, Any]]]:
    import pyarrow  # type: ignore[import-untyped]
    from datasets import load_dataset  # type: ignore[import-untyped]
    from datasets.exceptions import DatasetGenerationError  # type: ignore[import-untyped]
    from datasets.utils.logging import disable_progress_bar  # type: ignore[import-untyped]

    disable_progress_bar()
    failures = (OSError, ValueError, UnicodeDecodeError, pyarrow.ArrowException, DatasetGenerationError)
    try:
        stream = load_dataset(
            builder, data_files=[str(path)], split="train", streaming=True, cache_dir=str(cache_dir)
        )
        for number, row in enumerate(stream, start=1):
            if limit is not None and number > limit:
                return
            yield number, dict(row)
    except failures as exc:
        cause = exc.__cause__ or exc
        raise DatasetError(f"{name}: cannot read as {builder}: {type(cause).__name__}: {cause}") from exc
