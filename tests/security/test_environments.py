"""Environments from allowlists (issue 19, findings 5 and 6).

5. A job's `env` may not set loader or interpreter variables (LD_PRELOAD, PYTHONPATH, PATH...): refused at
   validate; a local node's head gets a built environment (no cloud keys, none of the fleet's settings) and
   every one of its ports listens on loopback.
6. A job's `env` may not set what the fleet, Ray, the vendor or the node's failsafe reads (FLEET_*, RAY_*,
   RUNPOD_POD_ID, CONTAINER_ID...); even a job that bypassed validation (one in the ledger from before) does
   not get them onto its node, and the fleet's own values are written last.
"""

from __future__ import annotations

import ast
import inspect
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import psutil
import pytest
from pydantic import SecretStr

from core import envnames
from core.errors import ConfigError
from jobs.sections import ProviderName
from jobs.sections.local import LocalSection
from jobs.spec import parse_job
from providers import bootstrap
from providers.base import LaunchRequest, ProviderContext
from providers.local.client import HeadMeta
from providers.local.environment import SYSTEM_PATH
from providers.local.provider import LocalProvider
from providers.onnode import failsafe, nodesetup
from providers.vastai.provider import VastAIProvider
from providers.vastai.section import VastAISection
from tests.fakes import FakeVastAI

REPO = Path(__file__).resolve().parents[2]
HEAD = "base_model: trainfleet/tiny-llama\ndatasets:\n  - path: tatsu-lab/alpaca\n"
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
CANARY = "canary-5e1f"


def problem_for(section: str, name: str, value: str = "x") -> tuple[str, int | None, str]:
    """The one problem validation finds in a job whose `section.env` sets `name`: (key, line, message)."""
    text = HEAD + f"{section}:\n  env:\n    {name}: {value}\n"
    with pytest.raises(ConfigError) as info:
        parse_job(text.encode(), source="job.yml", base_dir=REPO)
    (problem,) = info.value.problems
    return problem.path, problem.line, problem.message


# --- finding 5: loader and interpreter variables ------------------------------------------------------------

LOADER_NAMES = [
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "DYLD_INSERT_LIBRARIES",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "PYTHONHOME",
    "PYTHONUSERBASE",
    "PYTHONINSPECT",
    "PATH",
    "HOME",
    "BASH_ENV",
    "ENV",
    "PERL5LIB",
    "NODE_OPTIONS",
    "OPENSSL_CONF",
    "OPENSSL_MODULES",
]


@pytest.mark.parametrize("name", LOADER_NAMES)
def test_a_job_env_may_not_set_loader_or_interpreter_variables(name: str) -> None:
    for section in ("local", "runpod", "vastai"):
        assert problem_for(section, name, "/tmp/evil") == (
            f"{section}.env.{name}",
            6,
            f"{name}: {envnames.LOADER.reason}",
        )


# --- finding 6: the fleet's, Ray's, the vendor's and the failsafe's names -----------------------------------

FLEET_NAMES = [
    "FLEET_RAY_HEAD_ADDRESS",
    "FLEET_RAY_TEMP_DIR",
    "FLEET_DEADLINE_S",
    "RAY_TMPDIR",
    "RAY_ADDRESS",
    "RAY_AUTH_MODE",
    "RUNPOD_POD_ID",
    "RUNPOD_API_BASE_URL",
    "VAST_CONTAINERLABEL",
    "CONTAINER_ID",
    "TMPDIR",
    "PUBLIC_KEY",
    "HF_ENDPOINT",  # the node's credentials go where these say: the fleet's settings, never a job's
    "WANDB_BASE_URL",
]


@pytest.mark.parametrize("name", FLEET_NAMES)
def test_a_job_env_may_not_set_what_the_fleet_ray_or_the_failsafe_reads(name: str) -> None:
    key, line, message = problem_for("runpod", name)
    assert (key, line) == (f"runpod.env.{name}", 6)
    assert message.startswith(f"{name}: ") and "a job cannot set" in message


def test_ordinary_names_stay_settable() -> None:
    text = HEAD + "vastai:\n  env:\n    NCCL_DEBUG: INFO\n    HF_HUB_OFFLINE: 1\n"
    env = parse_job(text.encode(), source="job.yml", base_dir=REPO).spec.section.env
    assert env == {"NCCL_DEBUG": "INFO", "HF_HUB_OFFLINE": "1"}


@pytest.mark.parametrize("section", ["local", "runpod", "vastai", "cloud"])
def test_a_job_cannot_inject_faults_into_its_trainer(section: str) -> None:
    # A job that crashed or NaN'd its own trainer at will could also starve its rollbacks or stall a
    # node the fleet pays for: fault injection is the operator's drill (settings.fault_injection).
    key, line, message = problem_for(section, "FLEET_INJECT", "crash_after_step:1")
    assert (key, line) == (f"{section}.env.FLEET_INJECT", 6)
    assert "fault injection" in message and "fault_injection" in message


ENV_GETTERS = {"env", "environ"}
_SHELL_REF = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
_SHELL_SET = re.compile(r"(?:^|[\s;(])([A-Za-z_][A-Za-z0-9_]*)=")


def env_reads(module: ModuleType) -> set[str]:
    """The variable names `module` reads from an environment: `env["X"]`, `env.get("X")`, `os.environ[...]`
    with a literal or a module constant, and every module constant named `*_ENV`."""
    names: set[str] = set()

    def value(node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name) and isinstance(getattr(module, node.id, None), str):
            return str(getattr(module, node.id))
        return None

    def is_env(node: ast.expr) -> bool:
        return (isinstance(node, ast.Name) and node.id in ENV_GETTERS) or (
            isinstance(node, ast.Attribute) and node.attr in ENV_GETTERS
        )

    for node in ast.walk(ast.parse(inspect.getsource(module))):
        found = None
        if isinstance(node, ast.Subscript) and is_env(node.value):
            found = value(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr == "get" and is_env(node.func.value):
                found = value(node.args[0])
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id.endswith("_ENV"):
                found = value(node.value)
        if found:
            names.add(found)
    return names


def script_reads() -> set[str]:
    """The variables the node's start scripts (every kind) read and do not set themselves."""
    scripts = [
        bootstrap.start_script(ProviderName("vastai")),
        bootstrap.start_script(
            ProviderName("runpod"), worker=True, private_host="$RUNPOD_POD_ID.runpod.internal"
        ),
        "\n".join(bootstrap.ACCESS_LINES),
    ]
    text = "\n".join(scripts)
    return set(_SHELL_REF.findall(text)) - set(_SHELL_SET.findall(text))


def test_every_name_the_node_side_reads_is_one_a_job_cannot_set() -> None:
    """The failsafe (stdlib only, so it cannot import core.envnames), the start script and the node setup:
    every name they read is refused in a job's env; NODE_READS lists the failsafe's that are not FLEET_*."""
    read = env_reads(failsafe) | env_reads(bootstrap) | env_reads(nodesetup) | script_reads()
    assert {"CONTAINER_ID", "RUNPOD_POD_ID", "FLEET_RAY_HEAD_ADDRESS", "PUBLIC_KEY"} <= read  # it finds them
    settable = sorted(name for name in read if envnames.job_may_set(name))
    assert settable == []
    failsafe_own = {n for n in env_reads(failsafe) if not n.startswith(envnames.FLEET_PREFIX)}
    clouds_set = {name for group in envnames.clouds() for name in group.names}  # each cloud's facts.py
    assert failsafe_own <= set(envnames.NODE_READS) | clouds_set


# --- the fleet's values last, whatever the job's env holds -------------------------------------------------

SMUGGLED = {
    "LD_PRELOAD": "/tmp/evil.so",
    "PYTHONPATH": "/tmp/evil",
    "FLEET_RAY_HEAD_ADDRESS": "127.0.0.1:1",
    "FLEET_DEADLINE_S": "0",
    "CONTAINER_ID": "0",
    "RUNPOD_POD_ID": "not-this-pod",
    "PUBLIC_KEY": "ssh-ed25519 AAAA attacker",
}


def test_a_node_env_never_takes_reserved_names_from_the_job_and_the_fleet_writes_last() -> None:
    """A section that bypassed validation (a job in the ledger from before the rule)."""
    section = LocalSection().model_copy(update={"env": {**SMUGGLED, "MY_SETTING": "kept", "HF_TOKEN": "job"}})
    request = LaunchRequest("tf-env-1", "env", section, secrets={"HF_TOKEN": SecretStr("fleet")})
    env = request.node_env(section.env, {"FLEET_DEADLINE_S": "3600", "MY_SETTING": "fleet's"})
    assert env == {"HF_TOKEN": "fleet", "MY_SETTING": "fleet's", "FLEET_DEADLINE_S": "3600"}


@pytest.mark.integration
def test_a_rented_node_is_created_without_the_jobs_reserved_names(tmp_path: Path) -> None:
    """vast.ai's create call (the fake's record of it): none of the smuggled names reach the instance, so the
    failsafe destroys this instance, watches its own head, and keeps its deadline."""
    with FakeVastAI(api_key="k", home=tmp_path / "fake", nodes="none") as vast:
        context = ProviderContext(
            home=tmp_path, credentials={"VAST_API_KEY": SecretStr("k")}, urls={"vastai": vast.url}
        )
        section = VastAISection(gpu="RTX_A5000", cloud_type="ALL", max_bid_per_gpu=0.5, terminate_after=-1)
        section = section.model_copy(update={"env": {**SMUGGLED, "MY_SETTING": "kept"}})
        inst = VastAIProvider(context).launch(
            LaunchRequest("tf-env-2", "env", section, heartbeat_timeout_s=60)
        )
        env = vast.instances[inst.provider_id].env
    assert env["MY_SETTING"] == "kept"
    assert not set(SMUGGLED) & set(env), sorted(set(SMUGGLED) & set(env))
    assert env[failsafe.HEARTBEAT_ENV] == "60"


# --- a local node's head: built environment, loopback only -------------------------------------------------


@dataclass
class Head:
    meta: HeadMeta
    provider: LocalProvider
    evil: Path  # a PYTHONPATH entry whose sitecustomize leaves a mark in every process it runs in


@pytest.fixture(scope="module")
def local_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Head]:
    """A real local head, launched by the local provider while the fleet's environment holds canary cloud
    keys and settings, for a job whose env (validation bypassed) sets PYTHONPATH and the fleet's names."""
    home = tmp_path_factory.mktemp("envs")
    evil = home / "evil"
    evil.mkdir()
    (evil / "sitecustomize.py").write_text(
        f"import os, pathlib\npathlib.Path({str(evil)!r}, f'ran-in-{{os.getpid()}}').write_text('')\n"
    )
    section = LocalSection(num_cpus=1).model_copy(
        update={
            "env": {"PYTHONPATH": str(evil), "FLEET_RAY_TEMP_DIR": "/tmp/elsewhere", "MY_SETTING": "kept"}
        }
    )
    provider = LocalProvider(ProviderContext(home=home))
    fleet_env = {
        "RUNPOD_API_KEY": f"{CANARY}-runpod",
        "VAST_API_KEY": f"{CANARY}-vast",
        "AWS_SECRET_ACCESS_KEY": f"{CANARY}-aws",
        "HF_TOKEN": f"{CANARY}-fleet-hf",
        "FLEET_HOME": f"/{CANARY}/home",
        "HF_ENDPOINT": "http://127.0.0.1:9/hub",
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in fleet_env.items():
            patch.setenv(name, value)
        request = LaunchRequest("tf-envs-1", "envs", section, secrets={"HF_TOKEN": SecretStr("given-hf")})
        provider.launch(request)
    meta = provider.heads.read("tf-envs-1")
    assert meta is not None
    try:
        deadline = time.monotonic() + 60  # `ray start` and its first children (the GCS) are running
        while len(provider.heads.processes(meta)) < 2:
            assert time.monotonic() < deadline, provider.heads.log_tail(meta.name)
            time.sleep(0.5)
        yield Head(meta, provider, evil)
    finally:
        provider.terminate("tf-envs-1")


def listening(head: Head) -> dict[tuple[str, int], str]:
    """Every listening TCP socket of the head's process tree: (address, port) -> the process's name."""
    found = {}
    for proc in head.provider.heads.processes(head.meta):
        try:
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found[(conn.laddr.ip, conn.laddr.port)] = proc.name()
        except psutil.Error:
            continue
    return found


@pytest.mark.integration
def test_every_port_of_a_local_head_listens_on_loopback_only(local_head: Head) -> None:
    """GCS, raylet and object manager, dashboard and its agent, metrics, runtime env agent, client server."""
    wanted = set(local_head.meta.ports.values())
    deadline = time.monotonic() + 150
    while missing := wanted - {port for _ip, port in listening(local_head)}:
        log = local_head.provider.heads.log_tail(local_head.meta.name)
        assert time.monotonic() < deadline, f"ports never listened: {missing}; {log}"
        time.sleep(1)
    exposed = {where: name for where, name in listening(local_head).items() if where[0] not in LOOPBACK}
    assert exposed == {}


@pytest.mark.integration
def test_a_local_head_runs_in_a_built_environment(local_head: Head) -> None:
    """No cloud key or fleet setting of the fleet's environment, no PYTHONPATH or FLEET_* from the job (its
    sitecustomize never ran), the head's own PATH; what the node needs still arrives."""
    procs = [psutil.Process(local_head.meta.pid), *local_head.provider.heads.processes(local_head.meta)]
    environs = {}
    for proc in procs:
        try:
            environs[proc.pid] = proc.environ()
        except psutil.Error:
            continue
    head_env = environs[local_head.meta.pid]
    assert head_env["PATH"] == ":".join((str(local_head.provider.heads.python.parent), *SYSTEM_PATH))
    assert (head_env["HF_TOKEN"], head_env["HF_ENDPOINT"], head_env["MY_SETTING"]) == (
        "given-hf",
        "http://127.0.0.1:9/hub",
        "kept",
    )
    for pid, environ in environs.items():
        leaked = sorted(k for k, v in environ.items() if CANARY in v)
        assert leaked == [], f"process {pid} holds the fleet's {leaked}"
        assert "PYTHONPATH" not in environ or str(local_head.evil) not in environ["PYTHONPATH"]
        assert "FLEET_RAY_TEMP_DIR" not in environ
    assert sorted(p.name for p in local_head.evil.iterdir()) == ["sitecustomize.py"]
