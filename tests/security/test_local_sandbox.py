"""Issue 39, item 1: no code from a job runs on the fleet machine as the fleet.

A local node runs in bubblewrap (providers.local.sandbox): its own pid namespace, the fleet's home, the
user's home, /tmp and the settings and secrets files out of sight, everything read-only but its own root
and the model cache, and, as the fleet runs as root here, a uid of its own. Shown with a real local Ray
head and a Ray job that probes what it can reach, beside the same probe on a head the operator left
unsandboxed (FLEET_LOCAL_SANDBOX=none), which reaches all of it: the probe can tell.

Also: the keys that make axolotl import a job's code are refused for a local job, with key and line; and
axolotl's own config check (`fleet validate`) gets no credential of the fleet's and opens no file outside
the job's places (before, `deepspeed: /etc/shadow` told "exists", "missing" and "is JSON" apart).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.errors import ConfigError, NodeError
from core.settings import Settings
from jobs.sections.local import LocalSection
from jobs.spec import load_job, parse_job
from providers.base import LaunchRequest, NodeState, ProviderContext
from providers.local.client import AXOLOTL_VENV
from providers.local.provider import LocalProvider
from providers.node import JobStatus, NodeClient
from service.axolotl_check import check
from tests.factories import REPO_ROOT

CANARY = "canary-sandbox-9d2e"
PROBE = """
import json, os, sys
fleet_pid, secrets, home, repo = sys.argv[1:5]
def can(action):
    try:
        action()
        return True
    except OSError:
        return False
def environ():
    with open(f"/proc/{fleet_pid}/environ", "rb") as f:
        return f.read()
root = os.environ.get("FLEET_NODE_ROOT", os.getcwd())
found = {
    "uid": os.getuid(),
    "sees_fleet_process": fleet_pid in os.listdir("/proc"),
    "reads_fleet_environ": can(environ) and b"CANARY" in environ(),
    "reads_secrets": can(lambda: open(secrets).read()) and "CANARY" in open(secrets).read(),
    "lists_fleet_home": can(lambda: os.listdir(home)),
    "writes_repo": can(lambda: open(os.path.join(repo, ".sandbox-probe"), "w").close()),
    "writes_own_root": can(lambda: open(os.path.join(root, "probe"), "w").close()),
}
print("PROBE " + json.dumps(found))
""".replace("CANARY", CANARY)


def _probe(tmp_path: Path, sandbox: str) -> dict[str, object]:
    """What a Ray job on a local node (sandboxed as `sandbox` says) could reach of a fleet process holding a
    canary credential in its environment, of the fleet's secrets file, home and repository."""
    home = tmp_path / sandbox / "home"
    home.mkdir(parents=True)
    (home / "private").write_text("the fleet's\n")
    secrets = tmp_path / sandbox / "secrets.yml"
    secrets.write_text(f"RUNPOD_API_KEY: {CANARY}\n")
    secrets.chmod(0o600)
    fleet = subprocess.Popen(["sleep", "300"], env={"RUNPOD_API_KEY": CANARY})  # stands for `fleet run`
    context = ProviderContext(home=home, local_sandbox=sandbox, private_paths=(home, secrets))
    provider = LocalProvider(context)
    name = f"tf-sandbox-{sandbox}"
    try:
        provider.launch(LaunchRequest(name, "sandbox", LocalSection(num_cpus=1)))
        deadline = time.monotonic() + 120
        while (state := provider.get(name)) is None or state.state is not NodeState.RUNNING:
            assert state is None or state.state is not NodeState.FAILED, state
            assert time.monotonic() < deadline, provider.heads.log_tail(name)
            time.sleep(0.5)
        client = NodeClient(provider.endpoint(name))
        files = home.parent / "files"
        files.mkdir()
        (files / "probe.py").write_text(PROBE)  # travels as the job's working_dir, as a job's files do
        args = f"{fleet.pid} {secrets} {home} {REPO_ROOT}"
        while True:  # the head answers before its agent takes jobs, as the stages find (they retry too)
            try:
                client.submit("probe", f"python probe.py {args}", {}, files)
                break
            except NodeError as exc:
                assert "No available agent" in str(exc) and time.monotonic() < deadline, exc
                time.sleep(0.5)
        while (info := client.info("probe")) is None or not info.status.is_terminal():
            assert time.monotonic() < deadline + 60, "the probe did not end"
            time.sleep(0.5)
        logs = client.logs("probe")
        assert info.status is JobStatus.SUCCEEDED, logs
        (line,) = [x for x in logs.splitlines() if x.startswith("PROBE ")]
        found: dict[str, object] = json.loads(line.removeprefix("PROBE "))
        return found
    finally:
        provider.terminate(name)
        fleet.kill()
        fleet.wait()
        (REPO_ROOT / ".sandbox-probe").unlink(missing_ok=True)


@pytest.mark.integration
def test_a_sandboxed_local_node_reaches_nothing_of_the_fleets(tmp_path: Path) -> None:
    bare = _probe(tmp_path, "none")  # the probe can tell: unsandboxed, the node is the fleet
    assert bare["sees_fleet_process"] and bare["reads_fleet_environ"] and bare["reads_secrets"], bare
    assert bare["lists_fleet_home"] and bare["writes_repo"], bare
    walled = _probe(tmp_path, "auto")
    assert walled == {
        "uid": 65533 if os.geteuid() == 0 else os.geteuid(),
        "sees_fleet_process": False,
        "reads_fleet_environ": False,
        "reads_secrets": False,
        "lists_fleet_home": False,
        "writes_repo": False,
        "writes_own_root": True,
    }


AXOLOTL_JOB = """base_model: org/model
datasets:
  - path: org/data
    type: alpaca
adapter: lora
learning_rate: 0.0001
micro_batch_size: 1
num_epochs: 1
"""


def _refused(text: str) -> dict[str, tuple[int | None, str]]:
    with pytest.raises(ConfigError) as refused:
        parse_job(text.encode(), source="job.yml", base_dir=REPO_ROOT)
    return {p.path: (p.line, p.message) for p in refused.value.problems}


def test_a_local_job_may_not_name_code_to_import(tmp_path: Path) -> None:
    """Each key that makes axolotl import code of the job's choosing, with its line; on a rented node the
    same keys pass (the code runs on the job's own machine)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "rows.jsonl").write_text('{"instruction": "a", "output": "b"}\n')
    (tmp_path / "data" / "chatml.py").write_text("import os\n")  # importable from the node's working dir
    text = (
        "base_model: org/model\ndatasets:\n"
        "  - path: org/data\n    type: mypackage.load\n    trust_remote_code: true\n"
        "  - path: chat/data\n    type: chat_template.default\n"  # axolotl's own strategy: fine
        f"  - path: {tmp_path / 'data'}\n    type: alpaca\n"
        "adapter: lora\nlearning_rate: 0.0001\nmicro_batch_size: 1\nnum_epochs: 1\n"
        "trust_remote_code: true\nplugins:\n  - mypackage.Plugin\ntrainer_cls: mypackage.Trainer\n"
        "trl:\n  reward_funcs: [mypackage.reward]\n"
    )
    local = text + "local: {}\n"
    local_job = tmp_path / "job.yml"
    local_job.write_text(local)
    with pytest.raises(ConfigError) as refused:
        load_job(local_job)
    found = {p.path: (p.line, p.message) for p in refused.value.problems}
    assert sorted(found) == [
        "datasets[0].trust_remote_code",
        "datasets[0].type",
        "datasets[2].path",
        "plugins",
        "trainer_cls",
        "trl.reward_funcs",
        "trust_remote_code",
    ]
    lines = local.splitlines()
    assert found["plugins"][0] == lines.index("plugins:") + 1
    assert found["datasets[0].type"][0] == lines.index("    type: mypackage.load") + 1
    assert "chatml.py" in found["datasets[2].path"][1]
    assert all("the fleet's own machine" in message for _line, message in found.values())
    rented = tmp_path / "rented.yml"
    rented.write_text(text.replace(f"  - path: {tmp_path / 'data'}\n    type: alpaca\n", "") + "runpod: {}\n")
    assert load_job(rented).spec.train.model_extra["trust_remote_code"] is True  # type: ignore[index]


@pytest.mark.integration
def test_axolotls_check_opens_no_file_outside_the_job_and_holds_no_credential(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`deepspeed:` naming a file outside the job (a rented node's own path) gets the same verdict whether
    that file exists, is JSON or not, or is /etc/shadow; the check's interpreter sees none of the fleet's
    credentials. The interpreter is a wrapper that writes down its environment, then runs axolotl's."""
    python = REPO_ROOT / AXOLOTL_VENV / "bin" / "python"
    assert python.exists(), f"no axolotl environment at {python}: run `make axolotl-env`"
    seen = tmp_path / "seen-env.json"
    wrapper = tmp_path / "python"
    wrapper.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"open({str(seen)!r}, 'w').write(json.dumps(dict(os.environ)))\n"
        f"os.execv({str(python)!r}, [{str(python)!r}, *sys.argv[1:]])\n"
    )
    wrapper.chmod(0o700)
    for name in ("HF_TOKEN", "RUNPOD_API_KEY", "WANDB_API_KEY", "FLEET_SEAL_KEY"):
        monkeypatch.setenv(name, f"{CANARY}-{name}")
    settings = Settings(home=tmp_path / "home", axolotl_python=wrapper)
    (tmp_path / "valid.json").write_text('{"zero_optimization": {"stage": 2}}')
    (tmp_path / "not-json.json").write_text("not json\n")
    job = tmp_path / "job" / "job.yml"
    job.parent.mkdir()
    verdicts = set()
    for target in ("valid.json", "not-json.json", "missing.json", "/etc/shadow"):
        where = tmp_path / target if not target.startswith("/") else Path(target)
        job.write_text(AXOLOTL_JOB + f"deepspeed: {where}\ndeepcompile: true\nrunpod:\n  gpu_count: 1\n")
        verdict = check(settings, load_job(job, default_provider="runpod"))
        assert verdict is not None and verdict.version == "0.19.0"
        verdicts.add(tuple(p.message for p in verdict.problems))
        environ = json.loads(seen.read_text())
        leaked = sorted(k for k, v in environ.items() if CANARY in v)
        assert leaked == [] and environ["HF_HUB_OFFLINE"] == "1", leaked
    assert verdicts == {()}, verdicts
