"""The control plane as the compose images install it (`pip install .`; here `make control-env`'s
.venv-control): no torch, transformers or peft, and its CLI still checks a job, queues it, shows and cancels
it. A missing .venv-control fails this test (it does not skip): the environment is part of the setup."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONTROL = REPO / ".venv-control" / "bin"
EXAMPLE = REPO / "configs" / "examples" / "tiny-lora.yml"


def _run(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=REPO)


def test_the_control_plane_has_no_training_stack_and_its_cli_queues_a_job(env: dict[str, str]) -> None:
    assert (CONTROL / "fleet").exists(), "no .venv-control: run `make control-env` (`make setup` does)"
    for module in ("torch", "transformers", "peft"):
        probe = _run(str(CONTROL / "python"), "-c", f"import {module}", env=dict(os.environ))
        assert f"No module named '{module}'" in probe.stderr, (module, probe.stderr[-300:])

    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/"), **env}
    fleet = str(CONTROL / "fleet")
    assert _run(fleet, "--help", env=env).returncode == 0
    checked = _run(fleet, "validate", str(EXAMPLE), env=env)
    assert checked.returncode == 0 and f"ok {EXAMPLE}" in checked.stdout, checked.stdout + checked.stderr

    queued = _run(fleet, "enqueue", str(EXAMPLE), "--json", env=env)
    assert queued.returncode == 0, queued.stderr
    (run,) = json.loads(queued.stdout)
    shown = _run(fleet, "status", run["run_id"], "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["state"] == "QUEUED"
    cancelled = _run(fleet, "cancel", run["run_id"], env=env)
    assert cancelled.returncode == 0 and "CANCELLED" in cancelled.stdout, cancelled.stdout + cancelled.stderr
