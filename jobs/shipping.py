"""What travels to a rented node with each Ray job: the job's local datasets.

A rented node shares no disk with the fleet. At submit, the local files that a job's datasets name are
copied into the run's ``ship/`` directory (what trains is what was submitted, even if the files change
later) and the job's dataset paths are rewritten relative to it. prepare and train hand that directory to
the Ray Jobs API as the job's runtime_env ``working_dir``: Ray uploads it to the head and makes it the
job's current directory, where the trainer looks relative paths up. Hub dataset ids travel as they are.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from core.errors import ConfigError, Problem
from trainer.config import TrainConfig
from trainer.data import dataset_files
from trainer.errors import DatasetError

SHIP_DIR = "ship"
# Ray refuses a runtime_env package of 512 MiB or more (its gRPC message limit); stay clear of it.
SHIP_LIMIT_BYTES = 400 * 1024 * 1024


def ship_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / SHIP_DIR


def ship_datasets(config: TrainConfig, source: str, dest: Path) -> TrainConfig:
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
            plan.append((i, root, dataset_files(ds)))
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
    return config.model_copy(update={"datasets": datasets})
