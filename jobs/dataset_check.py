"""Local datasets read at validate, so a wrong `type` or a broken file fails before a node is rented.

For each local dataset (its path already resolved and confined by jobs.spec / jobs.paths) the head of its
files is read (at most MAX_ROWS rows, and no file started once MAX_BYTES of files were read; a JSON array
file over MAX_BYTES is not read, since it cannot be streamed) and every row is turned into a record as the
builtin recipe will on the node (trainer.formats). The first bad row is named, with the line of the
dataset's `type` (or `path`): an unreadable file, an empty dataset and a row without the fields its
`type` needs are problems. What stopped early is said in `DatasetCheck.notes`.

Hub datasets are not read here: they are fetched on the node (trainer.data.localize_datasets). For axolotl
jobs only the types whose fields axolotl surely needs the same way are checked (alpaca, completion, with
no `ds_type`); the others are read only for being readable and non-empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import Problem
from jobs.problems import line_of
from trainer.config import AxolotlConfig, DatasetConfig
from trainer.data import dataset_files, is_builder_entry, to_record
from trainer.errors import DatasetError
from trainer.formats import RowError, needs
from trainer.rows import builder_of, read_rows

if TYPE_CHECKING:
    from jobs.spec import JobSpec

MAX_ROWS = 10_000
MAX_BYTES = 64 * 1024 * 1024
_AXOLOTL_CHECKED = ("alpaca", "completion")


@dataclass
class DatasetCheck:
    """What reading the local datasets found: problems, and notes on what was not read whole."""

    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def dataset_problems(spec: JobSpec, lines: Mapping[str, int]) -> list[Problem]:
    """The problems of the job's local datasets (see the module docstring)."""
    return check_datasets(spec, lines).problems


def check_datasets(spec: JobSpec, lines: Mapping[str, int]) -> DatasetCheck:
    """Read the head of each local dataset of the job; the first problem of each is reported."""
    found = DatasetCheck()
    for i, (ds, fields) in enumerate(_checkable(spec)):
        if not _is_local(ds):
            continue
        at = f"datasets[{i}]"
        problem = _check_one(ds, fields, found.notes, at)
        if problem is not None:
            message, about_fields = problem
            where = f"{at}.type" if about_fields else f"{at}.path"
            found.problems.append(Problem(where, message, line_of(lines, where)))
    return found


def _checkable(spec: JobSpec) -> list[tuple[DatasetConfig, bool]]:
    """The job's datasets as the builtin recipe reads them, each with whether its rows' fields are checked
    (not for an axolotl dataset of another type, or with a `ds_type`: only readable and non-empty)."""
    train = spec.train
    if not isinstance(train, AxolotlConfig):
        return [(ds, True) for ds in train.datasets]
    out = []
    for ds in train.datasets:
        extra = ds.model_extra or {}
        fields = "ds_type" not in extra and ds.type in _AXOLOTL_CHECKED
        values = {"path": ds.path, "data_files": ds.data_files, "type": ds.type if fields else "completion"}
        if isinstance(extra.get("field"), str) and extra["field"]:
            values["field"] = extra["field"]
        out.append((DatasetConfig.model_validate(values), fields))
    return out


def _is_local(ds: DatasetConfig) -> bool:
    """Local: an absolute path (jobs.spec made every local one so), or `path: json` with absolute files."""
    if Path(ds.path).is_absolute():
        return True
    names = [ds.data_files] if isinstance(ds.data_files, str) else list(ds.data_files or [])
    return is_builder_entry(ds) and bool(names) and all(Path(n).is_absolute() for n in names)


def _check_one(ds: DatasetConfig, fields: bool, notes: list[str], at: str) -> tuple[str, bool] | None:
    """(message, whether it is about the rows' fields) for the dataset's first problem, or None."""
    try:
        files = dataset_files(ds)
    except DatasetError as exc:
        return str(exc), False
    root = Path(ds.path).parent if Path(ds.path).is_absolute() else Path("/")
    forced = ds.path if is_builder_entry(ds) else None
    rows = read = 0
    for path in files:
        size = path.stat().st_size
        if rows >= MAX_ROWS or read >= MAX_BYTES or (size > MAX_BYTES and _json_array(path)):
            mb = read // 1_000_000
            notes.append(f"{at}: checked the first {rows} rows ({mb} MB); {path.name} and after not read")
            break
        read += size
        shown = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
        try:
            for where, row in read_rows(
                path, builder_of(path, forced), limit=MAX_ROWS - rows + 1, shown=shown
            ):
                if rows == MAX_ROWS:
                    notes.append(f"{at}: checked the first {rows} rows; stopped in {shown}")
                    return None
                rows += 1
                if fields:
                    to_record(ds, row, where)
        except RowError as exc:
            return f"{ds.type} needs {needs(ds)}; {exc}", True
        except DatasetError as exc:
            return str(exc), False
    if rows == 0:
        return "the dataset holds no rows", False
    return None


def _json_array(path: Path) -> bool:
    """Whether `path` is a .json file holding one JSON array (not streamed: read whole, or not at all)."""
    if path.suffix.lower() != ".json":
        return False
    with path.open("rb") as f:
        return f.read(4096).lstrip()[:1] == b"["
