"""An axolotl job checked with axolotl's own config model, when this machine has axolotl somewhere.

axolotl pins its own torch, transformers and peft, so it is never imported into the fleet: the check runs
`trainer.axolotl_schema` with an interpreter that has it (settings.axolotl_python; else the axolotl
environment beside the fleet's venv, `make axolotl-env`; else the fleet's own Python when the
`trainfleet[axolotl]` extra put axolotl there), with only the trainer package on its path. Its problems
come back in the job file's key-and-line format. Without axolotl anywhere, only trainfleet's typed keys
are checked and the rest waits for the node (`fleet validate` says so).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from core.errors import Problem
from core.settings import Settings
from jobs.problems import line_of
from jobs.spec import LoadedJob
from providers.local.client import AXOLOTL_VENV, beside_fleet
from trainer.config import FLEET_KEYS, AxolotlConfig

TRAINER_DIR = Path(__file__).resolve().parents[1] / "trainer"
CHECK_TIMEOUT_S = 180.0  # importing axolotl takes seconds; a cold disk, much longer


class AxolotlVerdict(BaseModel):
    """What axolotl's config model said of a job."""

    model_config = ConfigDict(frozen=True)

    version: str
    python: str
    problems: list[Problem]


def axolotl_python(settings: Settings) -> Path | None:
    """An interpreter that has axolotl, or None."""
    if settings.axolotl_python is not None:
        return settings.axolotl_python
    beside = beside_fleet(AXOLOTL_VENV)
    if beside.exists():
        return beside
    return Path(sys.executable) if importlib.util.find_spec("axolotl") is not None else None


def check(settings: Settings, job: LoadedJob) -> AxolotlVerdict | None:
    """axolotl's verdict on an axolotl job (None: not an axolotl job, or no axolotl here). A check that
    cannot run is one problem saying why, never a pass."""
    train = job.spec.train
    python = axolotl_python(settings)
    if not isinstance(train, AxolotlConfig) or python is None:
        return None
    config = train.model_dump(mode="json", exclude_unset=True, exclude=set(FLEET_KEYS))
    with tempfile.TemporaryDirectory() as path:
        (Path(path) / "trainer").symlink_to(TRAINER_DIR)  # the trainer alone: none of the fleet's packages
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env.update(PYTHONPATH=path, AXOLOTL_DO_NOT_TRACK="1")
        try:
            done = subprocess.run(
                [str(python), "-m", "trainer.axolotl_schema"],
                input=json.dumps(config),
                capture_output=True,
                text=True,
                cwd=path,
                env=env,
                timeout=CHECK_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return AxolotlVerdict(version="?", python=str(python), problems=[_cannot(exc)])
    lines = done.stdout.strip().splitlines()
    try:
        said = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        said = None
    if done.returncode != 0 or not isinstance(said, dict):
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return AxolotlVerdict(version="?", python=str(python), problems=[_cannot(why)])
    problems = [
        Problem(p["path"], f"axolotl {said['axolotl']}: {p['message']}", line_of(job.lines, p["path"]))
        for p in said["problems"]
    ]
    return AxolotlVerdict(version=str(said["axolotl"]), python=str(python), problems=problems)


def _cannot(why: object) -> Problem:
    return Problem("", f"axolotl's own check could not run: {why}")
