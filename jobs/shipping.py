"""What travels to a rented node with each Ray job: the job's local datasets (and an axolotl job's local
DeepSpeed config).

A rented node shares no disk with the fleet. At submit, the local files that a job's datasets name are
copied into the run's ``ship/`` directory (what trains is what was submitted, even if the files change
later) and the job's dataset paths are rewritten relative to it. prepare and train hand that directory to
the Ray Jobs API as the job's runtime_env ``working_dir``: Ray uploads it to the head and makes it the
job's current directory, where the trainer looks relative paths up. Hub dataset ids travel as they are.
A builtin job ships the JSONL files its recipe reads; an axolotl job ships every file under a local
dataset path (axolotl reads parquet, arrow, csv, json, ...).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TypeVar

from core.errors import ConfigError, Problem
from trainer.config import DatasetConfig, DatasetRef, FleetKeys
from trainer.data import dataset_files, every_file
from trainer.errors import DatasetError

SHIP_DIR = "ship"
# Ray refuses a runtime_env package of 512 MiB or more (its gRPC message limit); stay clear of it.
SHIP_LIMIT_BYTES = 400 * 1024 * 1024
DEEPSPEED_DIR = "deepspeed"

Config = TypeVar("Config", bound=FleetKeys)


def ship_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / SHIP_DIR


def ship_datasets(config: Config, source: str, dest: Path) -> Config:
    """Copy the local files of `config`'s datasets under `dest` and return the config with their paths
    relative to it. ConfigError (naming the key) for a local base model or datasets over the limit."""
    problems = []
    if Path(config.base_model).is_absolute():
        problems.append(
            Problem("base_model", "a rented node cannot read a local model directory; use a hub model id")
        )
    plan: list[tuple[int, Path, list[Path]]] = []
    for i, ds in enumerate(config.datasets):
        root = Path(ds.path)
        if not root.is_absolute():
            continue  # a hub dataset id
        try:
            plan.append((i, root, _local_files(ds)))
        except DatasetError as exc:
            problems.append(Problem(f"datasets.{i}.path", str(exc)))
    total = sum(f.stat().st_size for _, _, files in plan for f in files)
    if total > SHIP_LIMIT_BYTES:
        problems.append(
            Problem(
                "datasets",
                f"the local datasets hold {total / 2**20:.0f} MiB; at most "
                f"{SHIP_LIMIT_BYTES / 2**20:.0f} MiB travel to a rented node with the job: put larger "
                "ones on the HF Hub and name them by id",
            )
        )
    if problems:
        raise ConfigError(source, problems)
    datasets = list(config.datasets)
    for i, root, files in plan:
        # datasets/<i>/<its own name>: never taken for a hub id, and the card can name it
        relative = Path("datasets", str(i), root.name)
        for f in files:
            inside = dest / relative / f.relative_to(root) if root.is_dir() else dest / relative
            inside.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, inside)
        datasets[i] = datasets[i].model_copy(update={"path": relative.as_posix()})
    update: dict[str, object] = {"datasets": datasets}
    deepspeed = (config.model_extra or {}).get("deepspeed")
    if isinstance(deepspeed, str) and Path(deepspeed).is_absolute() and Path(deepspeed).is_file():
        inside = Path(DEEPSPEED_DIR, Path(deepspeed).name)
        (dest / inside).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(deepspeed, dest / inside)
        update["deepspeed"] = inside.as_posix()
    return config.model_copy(update=update)


def _local_files(ds: DatasetRef) -> list[Path]:
    """The files of a local dataset that travel: what the builtin recipe reads, or all of it for axolotl."""
    if isinstance(ds, DatasetConfig):
        return dataset_files(ds)
    files = every_file(ds, Path(ds.path))  # what the axolotl node reads (trainer.axolotl_run)
    if not files:
        raise DatasetError(f"{ds.path}: no files")
    return files
