"""What travels to a rented node with each Ray job: the job's local datasets (and an axolotl job's local
DeepSpeed config).

A rented node shares no disk with the fleet. At submit, the local files that a job's datasets name are
copied into the run's ``ship/`` directory (what trains is what was submitted, even if the files change
later) and the job's dataset paths are rewritten relative to it. prepare and train hand that directory to
the Ray Jobs API as the job's runtime_env ``working_dir``: Ray uploads it to the head and makes it the
job's current directory, where the trainer looks relative paths up. Hub dataset ids travel as they are.
A builtin job ships the JSONL files its recipe reads; an axolotl job ships every file under a local
dataset path (axolotl reads parquet, arrow, csv, json, ...).

A git job on a node that shares this machine's files (an unsandboxed local one) ships too, for another
reason: its files are in a snapshot of its commit that is removed once it is submitted
(service.gitsnapshot). Only the files from that snapshot are copied, and named by their absolute path in
``ship/`` (the local node reads them there, in the run's directory); files under a data root are read
where they are.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from core.errors import ConfigError, Problem
from jobs.paths import Confinement, PathRefused, escapes, lexical
from trainer.config import DatasetConfig, DatasetRef, FleetKeys
from trainer.data import dataset_files, every_file
from trainer.errors import DatasetError
from trainer.rows import BUILDERS

SHIP_DIR = "ship"
# Ray refuses a runtime_env package of 512 MiB or more (its gRPC message limit); stay clear of it.
SHIP_LIMIT_BYTES = 400 * 1024 * 1024
DEEPSPEED_DIR = "deepspeed"

Config = TypeVar("Config", bound=FleetKeys)


def ship_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / SHIP_DIR


def ship_datasets(
    config: Config,
    source: str,
    dest: Path,
    paths: Confinement | None,
    *,
    from_commit: Path | None = None,
    node_is_here: bool = False,
) -> Config:
    """Copy the local files of `config`'s datasets under `dest` and return the config with their paths
    relative to it. ConfigError (naming the key) for a local base model, datasets over the limit, or a
    file `paths` (where the job's local files may be, jobs.paths; None: nowhere) no longer allows.

    `from_commit` (a git job's snapshot, for a node that shares this machine's files): copy only what is
    under it, name the copies by absolute path, and leave the rest (a local model, data roots) as named.
    `node_is_here` (a sandboxed local node): a local model stays where it is, for the node to read there."""
    paths = paths or Confinement(None)
    problems = []
    copied = _under(from_commit) if from_commit is not None else None
    if Path(config.base_model).is_absolute() and from_commit is None and not node_is_here:
        problems.append(
            Problem("base_model", "a rented node cannot read a local model directory; use a hub model id")
        )
    plan: list[tuple[int, Path, list[Path]]] = []
    for i, ds in enumerate(config.datasets):
        root = Path(ds.path)
        if ds.path in BUILDERS and ds.data_files is not None:  # axolotl's `path: json` + data_files
            files = [Path(f) for f in ([ds.data_files] if isinstance(ds.data_files, str) else ds.data_files)]
            if all(f.is_absolute() for f in files) and (copied is None or any(map(copied, files))):
                problems += _check_builder_files(i, files, paths)
                plan.append((i, root, files))
            continue
        if not root.is_absolute() or (copied is not None and not copied(root)):
            continue  # a hub dataset id (or, for `from_commit`, a file read where it is)
        try:
            files = _local_files(ds)
            for f in [root, *files]:  # checked again as they are now, links followed
                paths.check(lexical(f, root), str(f), directory=f == root)
                if escapes(str(_shipped_as(i, root, f))):  # before anything is copied
                    raise PathRefused(f"{_shipped_as(i, root, f)} would be written outside {SHIP_DIR}/")
            plan.append((i, root, files))
        except (DatasetError, PathRefused) as exc:
            problems.append(Problem(f"datasets[{i}].path", str(exc)))
    if from_commit is None:  # (a snapshot has its own limit)
        problems += _over_limit(plan)
    if problems:
        raise ConfigError(source, problems)
    datasets = list(config.datasets)

    def named(inside: Path) -> str:
        return (dest / inside).as_posix() if from_commit is not None else inside.as_posix()

    for i, root, files in plan:
        if not root.is_absolute():  # `path: json`: the files go to datasets/<i>/, data_files name them there
            shipped = [Path("datasets", str(i), f.name) for f in files]
            for f, inside in zip(files, shipped, strict=True):
                _copy(f, dest, inside, source, f"datasets[{i}].data_files")
            names: str | list[str] = [named(p) for p in shipped]
            if isinstance(datasets[i].data_files, str):
                names = names[0]
            datasets[i] = datasets[i].model_copy(update={"data_files": names})
            continue
        for f in files:
            _copy(f, dest, _shipped_as(i, root, f), source, f"datasets[{i}].path")
        datasets[i] = datasets[i].model_copy(update={"path": named(_shipped_as(i, root, root))})
    update: dict[str, object] = {"datasets": datasets}
    deepspeed = (config.model_extra or {}).get("deepspeed")
    # Only a DeepSpeed JSON the job may name travels; another absolute path is the node's own file.
    allowed = isinstance(deepspeed, str) and Path(deepspeed).is_absolute() and paths.allows(Path(deepspeed))
    if isinstance(deepspeed, str) and allowed and (copied is None or copied(Path(deepspeed))):
        try:
            paths.check(Path(deepspeed), deepspeed, directory=False)
        except PathRefused as exc:
            raise ConfigError(source, [Problem("deepspeed", str(exc))]) from None
        inside = Path(DEEPSPEED_DIR, Path(deepspeed).name)
        _copy(Path(deepspeed), dest, inside, source, "deepspeed")
        update["deepspeed"] = named(inside)
    return config.model_copy(update=update)


def _over_limit(plan: list[tuple[int, Path, list[Path]]]) -> list[Problem]:
    """The problem of datasets too large to travel with a Ray job, if they are."""
    total = sum(f.stat().st_size for _, _, files in plan for f in files)
    if total <= SHIP_LIMIT_BYTES:
        return []
    message = (
        f"the local datasets hold {total / 2**20:.0f} MiB; at most {SHIP_LIMIT_BYTES / 2**20:.0f} MiB travel "
        "to a rented node with the job: put larger ones on the HF Hub and name them by id"
    )
    return [Problem("datasets", message)]


def _under(top: Path) -> Callable[[Path], bool]:
    """Whether a path is under `top`, both with every link resolved."""
    real = top.resolve()
    return lambda path: real in Path(os.path.realpath(path)).parents


def _check_builder_files(i: int, files: list[Path], paths: Confinement) -> list[Problem]:
    """A `path: json` entry's data files, checked again as they are now; two may not share a name."""
    problems = []
    for f in files:
        try:
            paths.check(f, str(f), directory=False)
        except PathRefused as exc:
            problems.append(Problem(f"datasets[{i}].data_files", str(exc)))
    if len({f.name for f in files}) < len(files):
        problems.append(Problem(f"datasets[{i}].data_files", "two data_files share a file name"))
    return problems


def _shipped_as(i: int, root: Path, f: Path) -> Path:
    """Where file `f` of dataset `i` (at `root`) goes under ship/: datasets/<i>/<its own name>[/<inner>],
    never taken for a hub id, and the card can name it."""
    relative = Path("datasets", str(i), root.name)
    return relative / os.path.relpath(f, root) if f != root else relative


def _copy(src: Path, dest: Path, relative: Path, source: str, key: str) -> None:
    """Copy `src` to `dest / relative`, refused (ConfigError naming `key`) unless the destination, links
    followed, stays inside `dest`: whatever a job's paths say, nothing is written outside ship/."""
    message = f"{relative.as_posix()} would be written outside the job's {SHIP_DIR}/ directory"
    target = lexical(relative, dest)
    if Path(os.path.normpath(dest)) not in target.parents:
        raise ConfigError(source, [Problem(key, message)])
    target.parent.mkdir(parents=True, exist_ok=True)
    real = target.parent.resolve() / target.name
    if dest.resolve() not in real.parents or real.is_symlink():
        raise ConfigError(source, [Problem(key, message)])
    shutil.copyfile(src, real)


def _local_files(ds: DatasetRef) -> list[Path]:
    """The files of a local dataset that travel: what the builtin recipe reads, or all of it for axolotl."""
    if isinstance(ds, DatasetConfig):
        return dataset_files(ds)
    files = every_file(ds, Path(ds.path))  # what the axolotl node reads (trainer.axolotl_run)
    if not files:
        raise DatasetError(f"{ds.path}: no files")
    return files
