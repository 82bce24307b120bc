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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from core.errors import Problem
from core.settings import Settings
from jobs.paths import NODE_PATH_KEYS, Confinement, PathRefused, escapes, lexical
from jobs.problems import line_of
from jobs.spec import LoadedJob
from providers.local.client import AXOLOTL_VENV, beside_fleet
from providers.local.environment import SYSTEM_PATH
from trainer.config import FLEET_KEYS, AxolotlConfig

TRAINER_DIR = Path(__file__).resolve().parents[1] / "trainer"
CHECK_TIMEOUT_S = 180.0  # importing axolotl takes seconds; a cold disk, much longer
CHECK_ENV_KEPT = frozenset({"LANG", "LANGUAGE", "TZ"})  # of the fleet's environment: its locale only
NOT_HERE = "not-on-this-machine/path"  # a path the check may not open, as the check sees it


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
        config = confined(config, job.paths or Confinement(None), Path(path))
        env = check_env(os.environ, Path(path))
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


def check_env(environ: Mapping[str, str], work: Path) -> dict[str, str]:
    """The check's environment, built rather than inherited: no credential of the fleet's (it runs axolotl's
    validators, which may ask the Hub), no network for the Hub (a model's config is the node's to fetch),
    and a home, caches and temporary directory of its own (`work`, removed after it)."""
    kept = {k: v for k, v in environ.items() if k in CHECK_ENV_KEPT or k.startswith("LC_")}
    return {
        **kept,
        "PATH": os.pathsep.join(SYSTEM_PATH),
        "HOME": str(work),
        "TMPDIR": str(work),
        "HF_HOME": str(work / "hf"),
        "XDG_CACHE_HOME": str(work / "cache"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONPATH": str(work),
        "AXOLOTL_DO_NOT_TRACK": "1",
    }


def confined(config: dict[str, Any], paths: Confinement, work: Path) -> dict[str, Any]:
    """`config` as axolotl's check may see it: a path it would open (deepspeed's JSON, a model's config)
    that is not a file of the job's (`paths`, after links) is replaced, so that the check never opens a
    file of this machine's on a job's word (a rented node's own paths are the node's to read). A deepspeed
    JSON outside becomes an empty one of the check's own (`work`)."""
    out = dict(config)
    for key in ("deepspeed", *NODE_PATH_KEYS):
        value = out.get(key)
        if not isinstance(value, str) or not value or _inside(value, paths):
            continue
        if key == "deepspeed":
            placeholder = work / "deepspeed.json"
            placeholder.write_text('{"zero_optimization": {}}\n')
            out[key] = str(placeholder)
        else:
            out[key] = NOT_HERE
    return out


def _inside(value: str, paths: Confinement) -> bool:
    """Whether `value` is a path the check may open: a file of the job's, or a name that stays inside the
    check's own empty directory (a hub id)."""
    if value.startswith("~"):
        return False
    if not os.path.isabs(value):
        return not escapes(value)
    try:
        paths.check(lexical(Path(value), Path("/")), value)
    except PathRefused:
        return False
    return True


def _cannot(why: object) -> Problem:
    return Problem("", f"axolotl's own check could not run: {why}")
