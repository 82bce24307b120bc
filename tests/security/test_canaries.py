"""The canary test (issue 19): canary values in every credential the fleet holds and in a job's `env`; a
local run, a fake-cloud run that pushes to the Hub and a run that fails; then no canary anywhere it must not
be: events, logs, the ledger, Celery messages, the AOF, Flower's API, W&B files, the model card, the Hub
fake, and no node holds a credential beyond what its job needs.

A job's `env` is configuration its submitter chose to send to the node (credentials are refused in it at
validate: jobs.secretscan), so its canary must reach the node, and may stay in the job's own record (the
run in the ledger, the AOF that persists it, the run's copy of its job file); anywhere else it is a leak.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from state.keys import run_key
from state.stages import RunState
from tests.factories import RUNPOD_SECTION, light_job_file
from tests.fakes import FakeRunPod
from tests.faults.canaries import CANARIES
from tests.faults.case import Case
from tests.faults.invariants import redis_texts
from tests.faults.live import LiveFleet
from tests.integration.flowerproc import api_tasks, flower, get_json

pytestmark = pytest.mark.integration

ENV_CANARY = "envcanary-4d8b1f6e2a9c7305"
JOBS = ("local", "cloud", "failing")  # each job's value is ENV_CANARY-<job>: tells its node's processes apart


def env_section(job: str) -> str:
    return f"  env:\n    TEAM_SETTING: {ENV_CANARY}-{job}\n"


@dataclass(frozen=True)
class Seen:
    command: str
    held: frozenset[str]
    """The canaries its environment holds (by name)."""
    job: str | None
    """Whose node it belongs to (by the job's env value), if any."""


class NodeEnvs:
    """Every process outside the control plane, sampled while the runs go: which canaries its environment
    holds. The control plane (`python -m fleet ...`: the worker, its pool, the CLI) holds the fleet's
    credentials by design; the test process holds none."""

    def __init__(self, every_s: float = 0.5) -> None:
        self.seen: dict[int, Seen] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(every_s,), daemon=True)
        self._thread.start()

    def _watch(self, every_s: float) -> None:
        values = {**CANARIES, "JOB_ENV": ENV_CANARY}  # each job's value holds it
        while not self._stop.wait(every_s):
            for proc in psutil.process_iter(["pid", "cmdline"]):
                if proc.pid == os.getpid() or proc.pid in self.seen:
                    continue
                cmdline = " ".join(proc.info["cmdline"] or [])
                if "-m fleet" in cmdline or "fleet.cli" in cmdline:
                    continue
                with contextlib.suppress(psutil.Error):
                    env = proc.environ()
                    held = frozenset(name for name, v in values.items() if any(v in x for x in env.values()))
                    if held:
                        job = next((j for j in JOBS if env.get("TEAM_SETTING") == f"{ENV_CANARY}-{j}"), None)
                        self.seen[proc.pid] = Seen(cmdline[:300], held, job)

    def stop(self) -> dict[int, Seen]:
        self._stop.set()
        self._thread.join(10)
        return self.seen


def _env_canary_hits(case: Case, job_records: set[str]) -> Iterator[str]:
    """Where the job-env canary shows up outside the job's own record."""
    for index, client in enumerate(case.clients()):
        for key, text in redis_texts(client):
            if ENV_CANARY in text and key not in job_records:
                yield f"job env in redis[{index}]:{key}"
    roots = [*case.homes, *case.published]
    for path in sorted({p for root in roots for p in root.rglob("*") if p.is_file()} | set(case.logs)):
        if path.name in ("job.yml", "appendonly.aof") or path.parent.name == "appendonlydir":
            continue  # the job's own record: its file, and the AOF that persists the ledger's run
        with contextlib.suppress(OSError):
            if ENV_CANARY.encode() in path.read_bytes():
                yield f"job env in {path}"


def test_no_canary_where_it_must_not_be(case: Case, tmp_path: Path) -> None:
    fake = case.cloud(FakeRunPod, tmp_path / "fake", nodes="ray")
    fleet = LiveFleet(case, tmp_path / "fleet", [fake], WANDB_MODE="offline")
    nodes = NodeEnvs()
    case.watch_log(tmp_path / "flower.log")
    at = case.stack.enter_context(flower(fleet.env, tmp_path / "flower.log"))  # before the worker
    fleet.worker()
    local_section = "local:\n  one_shot: true\n"
    local = fleet.enqueue(
        light_job_file(tmp_path / "local", local_section + env_section("local"), "wandb_project: canary\n")
    )
    cloud = fleet.enqueue(
        light_job_file(
            tmp_path / "cloud",
            RUNPOD_SECTION + env_section("cloud"),
            "hub_model_id: tester/canary-lora\nwandb_project: canary\n",
        )
    )
    # Fails on its node: a base model the Hub does not serve (so, by the rule, its node gets HF_TOKEN).
    failing_job = light_job_file(tmp_path / "failing", local_section + env_section("failing"))
    failing_job.write_text(failing_job.read_text().replace("trainfleet/tiny-llama", "nobody/no-such-model"))
    failing = fleet.enqueue(failing_job)
    case.expect(local, RunState.SUCCEEDED)
    case.expect(cloud, RunState.SUCCEEDED)
    case.expect(failing, RunState.FAILED)
    case.check()  # every credential canary: Redis (ledger, events, Celery messages), logs, homes, the Hub
    seen = nodes.stop()

    tasks = api_tasks(at)
    assert {t["name"] for t in tasks.values()} >= {"trainfleet.provision", "trainfleet.train"}, tasks
    shown = json.dumps([tasks, get_json(f"{at.url}/api/workers", headers=at.headers())])
    assert [n for n, v in {**CANARIES, "JOB_ENV": ENV_CANARY}.items() if v in shown] == [], "in Flower's API"

    pushed = [p.read_bytes() for p in (tmp_path / "hub").rglob("*") if p.is_file()]  # content-addressed
    assert any(b"tester/canary-lora" in blob and b"TEAM_SETTING" in blob for blob in pushed), (
        "the cloud run pushed no model card (with the job's env names): the Hub fake was not worth scanning"
    )
    # (a local node's W&B files stay in its root, under the fleet's home, as its checkpoints do)
    assert list((tmp_path / "fleet").rglob("*.wandb")), "no W&B files were written to scan"
    records = {run_key(run_id) for run_id in (local, cloud, failing)}
    assert list(_env_canary_hits(case, records)) == []

    reached = {p.job for p in seen.values()}
    assert set(JOBS) <= reached, f"a job's env never reached its node: only {reached}"
    needless = {pid: p for pid, p in seen.items() if p.held - {"JOB_ENV", "HF_TOKEN"}}
    assert needless == {}, "a node holds a credential its job does not need"
    # HF_TOKEN: the cloud run pushes to the Hub, the failing one reads a repo the Hub will not show
    # anonymously; the local run does neither, so none of its processes may hold it.
    with_token = {p.job for p in seen.values() if "HF_TOKEN" in p.held}
    assert with_token <= {"cloud", "failing"}, f"a node whose job does not use the Hub holds HF_TOKEN: {seen}"
    assert "cloud" in with_token, "the node that pushes to the Hub never got HF_TOKEN"
