"""A fork of axolotl (the section's axolotl_git, axolotl_git_branch): refused where it cannot apply, turned
into the node's pin (a PEP 508 direct reference), installed by the node's real setup program from a git
repository, seen by the readiness check, and pinned to the commit the run's first node got."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import venv
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from core.errors import ConfigError
from jobs.spec import parse_job
from providers.base import NodeSoftware
from providers.bootstrap import axolotl_pins, node_pins, node_setup_env
from providers.onnode import nodesetup
from tests.factories import REPO_ROOT, axolotl_config, train_config
from workers import readiness

HEAD = "base_model: trainfleet/tiny-llama\ndatasets:\n  - path: tatsu-lab/alpaca\n    type: alpaca\n"
FORK = "runpod:\n  axolotl_git: https://github.com/utensil/axolotl\n  axolotl_git_branch: large_dataset\n"
URL = "git+https://github.com/utensil/axolotl"
RAY = next(pin for pin in node_pins() if pin.startswith("ray"))


def problems_of(text: str) -> list[tuple[str, int | None, str]]:
    with pytest.raises(ConfigError) as info:
        parse_job(text.encode(), source="job.yml", base_dir=REPO_ROOT)
    return [(p.path, p.line, p.message) for p in info.value.problems]


def test_a_fork_is_for_axolotl_jobs_and_replaces_the_release() -> None:
    ((path, line, why),) = problems_of("trainer: builtin\nadapter: lora\n" + HEAD + FORK)
    assert (path, line) == ("runpod.axolotl_git", 8) and "the builtin recipe does not run" in why
    ((path, line, why),) = problems_of("axolotl_version: 0.19.0\n" + HEAD + FORK)
    assert (path, line) == ("runpod.axolotl_git", 7) and "its release 0.19.0 (axolotl_version)" in why
    job = parse_job((HEAD + FORK).encode(), source="job.yml", base_dir=REPO_ROOT)
    assert job.spec.train.trainer == "axolotl" and job.spec.section.axolotl_fork() == (URL, "large_dataset")


def test_the_fork_is_the_nodes_pin_and_later_nodes_get_the_first_ones_commit() -> None:
    fork = (URL, "large_dataset")
    first = NodeSoftware.of(axolotl_config(), "0.19.0", fork)
    assert (first.axolotl_version, first.axolotl_source) == (None, f"{URL}@large_dataset")
    later = NodeSoftware.of(axolotl_config(), "0.19.0", fork, commit="0a1b2c3")
    assert later.axolotl_source == f"{URL}@0a1b2c3"
    assert NodeSoftware.of(axolotl_config(), "0.19.0", (URL, None)).axolotl_source == URL
    assert NodeSoftware.of(train_config(), "0.19.0", fork) == NodeSoftware()  # the builtin's: no axolotl
    assert axolotl_pins(None, first.axolotl_source) == (f"axolotl@{URL}@large_dataset", RAY)
    assert node_setup_env(first)[nodesetup.PINS_ENV] == f"axolotl@{URL}@large_dataset {RAY}"
    assert "--axolotl=any" in shlex.split(readiness.entrypoint(1, first))  # its version is the fork's own


@pytest.mark.parametrize(
    ("source", "split"),
    [
        (f"{URL}@large_dataset", ("https://github.com/utensil/axolotl", "large_dataset")),
        (URL, ("https://github.com/utensil/axolotl", None)),
        ("git+ssh://git@github.com/me/axolotl.git@v2", ("ssh://git@github.com/me/axolotl.git", "v2")),
        ("git+ssh://git@github.com/me/axolotl.git", ("ssh://git@github.com/me/axolotl.git", None)),
    ],
)
def test_a_source_is_its_url_and_its_ref(source: str, split: tuple[str, str | None]) -> None:
    assert nodesetup.split_source(source) == split


def fork_repo(where: Path) -> tuple[Path, str]:
    """A git repository holding a stand-in `axolotl` (a package of that name, nothing of axolotl's) on
    the branch `fork`; its path and that branch's commit."""
    where.mkdir()
    (where / "axolotl").mkdir()
    (where / "axolotl" / "__init__.py").write_text("FORK = True\n")
    (where / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "axolotl"\nversion = "0.0.1"\n[tool.setuptools]\npackages = ["axolotl"]\n'
    )
    git = ["git", "-C", str(where), "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (
        ["init", "-q", "-b", "main"],
        ["add", "."],
        ["commit", "-qm", "base"],
        ["checkout", "-qb", "fork"],
    ):
        subprocess.run([*git, *args], check=True)
    (where / "axolotl" / "__init__.py").write_text("FORK = 'the fork'\n")
    subprocess.run([*git, "commit", "-qam", "fork"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout
    return where, commit.strip()


FORK_URL = "https://git.example.invalid/fork/axolotl"  # as a job names it; git clones it from the repo


def clone_from(repo: Path) -> dict[str, str]:
    """Git's own URL rewriting (`url.<repo>.insteadOf`), in the environment: pip clones FORK_URL as a node
    would an https fork, and git fetches it from `repo` (no network here)."""
    return {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": f"url.file://{repo}.insteadOf",
        "GIT_CONFIG_VALUE_0": FORK_URL,
    }


def in_venv(python: Path, code: str, **env: str) -> Any:
    """Run `code` (which prints JSON) with the node venv's interpreter, the repository importable."""
    done = subprocess.run(
        [str(python), "-c", code], env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env},
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return json.loads(done.stdout)


def test_the_node_setup_installs_the_fork_and_the_check_reports_its_commit(tmp_path: Path) -> None:
    repo, commit = fork_repo(tmp_path / "repo")
    node = tmp_path / "node-venv"  # the image's own Python: a venv, which the setup adds to
    venv.EnvBuilder(with_pip=True).create(node)
    python = node / "bin" / "python"
    build = tmp_path / "build"  # setuptools for pip's build, offline (the node image's own, on a real node)
    build.mkdir()
    site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    (build / "setuptools").symlink_to(site / "setuptools")
    (build / "_distutils_hack").symlink_to(site / "_distutils_hack")
    pin = f"axolotl@git+{FORK_URL}@fork"
    env = {
        nodesetup.PINS_ENV: pin,
        nodesetup.ROOT_ENV: str(tmp_path / "root"),
        nodesetup.PIP_ARGS_ENV: "--no-index --no-build-isolation",
        "PYTHONPATH": str(build),
        **clone_from(repo),
    }
    setup = subprocess.run(
        [str(python), str(REPO_ROOT / "providers" / "onnode" / "nodesetup.py")],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert setup.returncode == 0, setup.stderr
    result = json.loads((tmp_path / "root" / nodesetup.RESULT).read_text())
    assert result["installed"] == [pin], (result, (tmp_path / "root" / nodesetup.LOG).read_text()[-2000:])

    asks = "import json; from providers.onnode.nodesetup import missing; print(json.dumps(missing({})))"
    assert in_venv(python, asks.format([pin])) == []  # installed from the fork's branch
    assert in_venv(python, asks.format([f"axolotl@git+{FORK_URL}@{commit}"])) == []  # ... at this commit
    assert in_venv(python, asks.format([f"axolotl@git+{FORK_URL}@main"])) != []  # not another ref
    assert in_venv(python, asks.format(["axolotl@git+https://github.com/other/axolotl"])) != []  # nor URL
    seen = in_venv(
        python, "import json; from trainer.nodecheck import _axolotl_source as s; print(json.dumps(s()))"
    )
    assert seen == {"url": FORK_URL, "commit": commit, "ref": "fork"}


def test_the_readiness_check_refuses_a_node_not_on_the_fork(tmp_path: Path) -> None:
    job = parse_job((HEAD + FORK).encode(), source="job.yml", base_dir=REPO_ROOT)
    run = SimpleNamespace(spec=job.spec, progress=SimpleNamespace(axolotl_commit=None))
    ctx: Any = SimpleNamespace(settings=SimpleNamespace(axolotl_version="0.19.0"))
    on_it = {"axolotl_source": {"url": URL[4:], "commit": "abc", "ref": "large_dataset"}}
    assert readiness._fork_problems(ctx, run, on_it) == []  # type: ignore[arg-type]
    (why,) = readiness._fork_problems(ctx, run, {"axolotl_source": None})  # type: ignore[arg-type]
    assert why == f"axolotl on the node is not from git, the job asks for the fork {URL}@large_dataset"
    run.progress.axolotl_commit = "def"  # pinned by the first node: a later one on abc is not the run's
    (why,) = readiness._fork_problems(ctx, run, on_it)  # type: ignore[arg-type]
    assert why.endswith(f"at abc, the job asks for the fork {URL}@def")


def test_the_first_ready_node_pins_the_commit_and_a_later_one_keeps_it(redis_client: Any) -> None:
    from providers.runpod.section import RunPodSection
    from state.ledger import Ledger
    from state.models import Instance, InstanceState
    from state.payloads import NodeCheck
    from state.stages import RunState
    from tests.factories import ledger_run

    ledger = Ledger(redis_client)
    section = RunPodSection(
        axolotl_git="https://github.com/utensil/axolotl", axolotl_git_branch="large_dataset"
    )
    ledger.create_run(ledger_run("r1", section, RunState.PROVISIONING), [])
    ctx: Any = SimpleNamespace(ledger=ledger)
    for name, commit in (("tf-r1-1", "abc"), ("tf-r1-2", "def")):
        ledger.put_instance(Instance(name=name, provider="runpod", run_id="r1", state=InstanceState.RUNNING))
        check = NodeCheck(python="3.11", executable="p", axolotl_source={"url": URL[4:], "commit": commit})
        readiness._ready(ctx, ledger.get_run("r1"), name, check, [])
        assert ledger.get_run("r1").progress.axolotl_commit == "abc"  # the first node's, for every later one
