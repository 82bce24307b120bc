"""The README's by-hand recipes with the fakes, run as written: each ```bash block that serves a fake.

A recipe block is read out of README.md (so a README that drifts fails here): its `python -m tests.fakes
serve ...` lines each start a fake, as in a shell of its own, and the `export` lines each prints are pasted,
as printed, before the block's other lines, which run in one more shell, as the README says. Two things
differ from a person at a terminal, neither in the commands: each `--port N` is served on a free port
instead (the printed exports say which, and a test must not collide with a fake someone runs by hand), and
the fleet gets a home of its own (FLEET_HOME and no settings file: tests.integration.fleetproc.fleet_env).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.serving import EXPORTS_BEGIN, EXPORTS_END
from tests.integration.fleetproc import REPO, cleanup, fleet_env

pytestmark = pytest.mark.integration

README = REPO / "README.md"
SERVE = "tests.fakes serve"
BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
SERVED_IN_S = 60.0  # a fake's process up and its exports printed (imports, a certificate, on 2 busy cores)
# The tiny job on the fake RunPod's Ray pod: 60-90 s here, 140 s beside other trainings on 2 busy cores.
# Without the proxy's settings it waited for the node until FLEET_NODE_READY_TIMEOUT_S (300 s); now the
# node's unreachable cause ends provision sooner (providers.reach).
RUN_S = 300.0


@dataclass
class Recipe:
    """One README block: the fakes it serves (each a shell line) and the lines run after the exports."""

    serves: list[str]
    commands: list[str]

    @property
    def vendors(self) -> frozenset[str]:
        """What each serve line serves (the word after `serve`)."""
        words = [shlex.split(line, comments=True) for line in self.serves]
        return frozenset(w[w.index("serve") + 1] for w in words)


def readme_recipes(text: str) -> list[Recipe]:
    """The ```bash blocks of the README that serve a fake, split into their serve lines and the rest
    (comment-only and empty lines dropped)."""
    recipes = []
    for block in BLOCK.findall(text):
        if SERVE not in block:
            continue
        lines = [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        recipes.append(Recipe([ln for ln in lines if SERVE in ln], [ln for ln in lines if SERVE not in ln]))
    return recipes


def recipe_for(*vendors: str) -> Recipe:
    found = [r for r in readme_recipes(README.read_text()) if r.vendors == frozenset(vendors)]
    assert len(found) == 1, f"README.md has {len(found)} ```bash recipe blocks serving {sorted(vendors)}"
    return found[0]


@dataclass
class Fakes:
    """The fakes of a recipe, running; `exports` is what they printed to paste, `settings` the same parsed."""

    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    exports: list[str] = field(default_factory=list)
    settings: dict[str, str] = field(default_factory=dict)


def _lines(proc: subprocess.Popen[str]) -> queue.Queue[str | None]:
    """The process's stdout lines as they come (None at its end), read in a thread of their own."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def _serve(line: str, env: dict[str, str], log: Path, into: Fakes) -> None:
    """Start one serve line (its --port freed) and read its URL and exports, within SERVED_IN_S."""
    command = re.sub(r"--port \d+", "--port 0", line)
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {command}"], cwd=REPO, env=env, stdout=subprocess.PIPE,
        stderr=log.open("ab"), text=True, start_new_session=True,
    )  # fmt: skip
    into.procs.append(proc)
    lines, printed = _lines(proc), list[str]()
    deadline = time.monotonic() + SERVED_IN_S
    while EXPORTS_END not in printed:
        try:
            got = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"`{line}` printed no exports in {SERVED_IN_S:.0f} s: {printed}") from None
        assert got is not None, f"`{line}` ended: {printed} {log.read_text()[-2000:]}"
        printed.append(got)
    assert printed[0].startswith("http://127.0.0.1:") and printed[1] == EXPORTS_BEGIN, printed
    exports = printed[2:-1]
    assert exports and all(e.startswith("export ") for e in exports), printed
    into.exports += exports
    for export in exports:
        name, _, value = shlex.split(export)[1].partition("=")
        into.settings[name] = value


def _stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM) -> None:
    """Stop a process group this test started (SIGKILL if `sig` does not end it in 30 s)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@dataclass
class Shell:
    """The recipe's other shell: its exports pasted, then its lines, as one bash script."""

    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the recipe did not end in {timeout:.0f} s; its output: {self.output()[-3000:]}"
            ) from None

    def until(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait (the shell still running) until `check()`, within `timeout`."""
        deadline = time.monotonic() + timeout
        while not check():
            assert self.proc.poll() is None, f"the recipe ended before {what}: {self.output()[-3000:]}"
            assert time.monotonic() < deadline, f"no {what} in {timeout:.0f} s: {self.output()[-3000:]}"
            time.sleep(0.5)


@pytest.fixture
def scratch() -> Iterator[Path]:
    """TMPDIR for the fakes and the shell: a short path (Ray's socket paths must fit), removed after."""
    path = Path(tempfile.mkdtemp(prefix="tf-readme-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def run_recipe(tmp_path: Path, scratch: Path) -> Iterator[Callable[[Recipe], tuple[Fakes, Shell]]]:
    """Serve a recipe's fakes, then start its other shell; everything is stopped afterwards."""
    home = tmp_path / "fleet"
    env = {**fleet_env(home), "TMPDIR": str(scratch)}
    served, shells = Fakes(), []

    def run(recipe: Recipe) -> tuple[Fakes, Shell]:
        for line in recipe.serves:
            _serve(line, env, tmp_path / "fakes.log", served)
        script = "\n".join(["set -e", *served.exports, *recipe.commands])
        log = tmp_path / "shell.log"
        proc = subprocess.Popen(
            ["bash", "-c", script], cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        shells.append(Shell(proc, log))
        return served, shells[-1]

    try:
        yield run
    finally:
        for shell in shells:
            _stop(shell.proc)
        for proc in served.procs:
            _stop(proc)
        cleanup(home)


def fake_state(url: str) -> Any:
    with urllib.request.urlopen(f"{url}/_fake/state", timeout=10) as reply:
        return json.loads(reply.read())


def test_every_serve_recipe_in_the_readme_is_a_block_run_here() -> None:
    """A `serve` command written anywhere but in the blocks below would go untested."""
    text = README.read_text()
    assert sorted(sorted(r.vendors) for r in readme_recipes(text)) == [
        ["discord"],
        ["hub", "vastai", "wandb"],
        ["runpod"],
    ]
    assert SERVE not in BLOCK.sub("", text), "a `tests.fakes serve` command outside a ```bash recipe block"


def test_the_runpod_recipe_runs_the_tiny_job_on_the_fakes_pod(
    run_recipe: Callable[[Recipe], tuple[Fakes, Shell]],
) -> None:
    """`serve runpod --nodes ray` prints what the fleet needs to reach its pods (the API, the key, the
    HTTPS proxy and its certificate); `fleet run` of the README's job then succeeds and gives the pod back.
    Without the proxy's settings the run waited for a node it could not reach, for 300 s."""
    served, shell = run_recipe(recipe_for("runpod"))
    assert {
        "RUNPOD_API_BASE_URL",
        "RUNPOD_API_KEY",
        "FLEET_RUNPOD_PROXY_URL",
        "FLEET_RUNPOD_PROXY_CA_FILE",
    } <= set(served.settings)
    ca_file = Path(served.settings["FLEET_RUNPOD_PROXY_CA_FILE"])
    assert ca_file.read_text().startswith("-----BEGIN CERTIFICATE"), ca_file
    assert shell.wait(RUN_S) == 0, shell.output()[-3000:]
    assert re.search(r"^\S+ SUCCEEDED$", shell.output(), re.M), shell.output()[-3000:]
    state = fake_state(served.settings["RUNPOD_API_BASE_URL"])
    assert state["instances"] == [] and state["requests"]["create"] == 1


def test_the_vastai_hub_and_wandb_recipe_reaches_each_fake(
    run_recipe: Callable[[Recipe], tuple[Fakes, Shell]],
) -> None:
    """Their exports point the fleet at the vast.ai fake, and huggingface_hub and wandb at theirs."""
    served, shell = run_recipe(recipe_for("vastai", "hub", "wandb"))
    assert shell.wait(120) == 0, shell.output()[-3000:]
    assert "user: tester" in shell.output()  # hf auth whoami, with the Hub fake's token
    assert fake_state(served.settings["VAST_URL"])["requests"].get("list", 0) >= 1  # fleet instances
    runs = fake_state(served.settings["WANDB_BASE_URL"])["runs"]
    assert [r["project"] for r in runs] == ["by-hand"], runs  # the wandb client's run, on the W&B fake


def test_the_discord_recipe_posts_the_fleets_events_into_the_served_channel(
    run_recipe: Callable[[Recipe], tuple[Fakes, Shell]],
) -> None:
    """`serve discord --channel ID` makes the channel and prints the notifier's settings; `fleet notify`
    posts the queued run's line into it (before, the channel did not exist: 404 Unknown Channel for ever)."""
    served, shell = run_recipe(recipe_for("discord"))
    api, channel = served.settings["FLEET_DISCORD_API_BASE"], served.settings["FLEET_DISCORD_CHANNEL_ID"]
    url = api.removesuffix("/api/v10")

    def posted() -> bool:
        lines = fake_state(url)["channels"].get(channel, [])
        return any("configs/examples/tiny-lora.yml" in m["content"] for m in lines)

    shell.until(posted, 60, "run's line in the served channel")
    _stop(shell.proc, signal.SIGINT)  # Ctrl-C, as the README says
