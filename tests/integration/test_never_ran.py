"""A Ray job that Ray fails before its command starts (it could not set up the job's runtime environment)
is forgotten on the node and sent again, once, under the same id, with a `run.retrying` event; a second
such failure ends the job, and a job whose command ran and failed is never sent again. On a real Ray head:
the broken runtime environment is a working_dir the head's package store does not hold. And reading a job
(what a watcher does) takes the Jobs API's REST calls alone: no Ray imported on the fleet's side."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from core.settings import Settings
from jobs.sections.local import LocalSection
from providers.base import NodeEndpoint
from providers.local.client import HeadMeta
from providers.node import JobInfo, JobStatus, NodeClient
from state.events import read_run
from state.payloads import EventType, RunRetrying
from state.stages import RunState
from tests.factories import ledger_run
from tests.integration.fleetproc import REPO
from workers import context
from workers.node_job import submit_once

pytestmark = pytest.mark.integration
NO_SUCH_PACKAGE = {"working_dir": "gcs://_ray_pkg_0123456789abcdef.zip"}


@pytest.fixture
def ctx(redis_client: redis.Redis[str], redis_url: str, fleet_home: Path) -> Iterator[context.Context]:
    from broker.app import configure

    settings = Settings(home=fleet_home)
    configure(settings, redis_url)
    yield context.init(settings, redis_url)


def until_ended(ctx: context.Context, client: NodeClient, sid: str, submit: Callable[[], None]) -> JobInfo:
    """Call submit_once as the stage's polls would, until it gives back the ended job."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        run = ctx.ledger.get_run("r1")
        info = submit_once(ctx, run, client, "prepare", sid, submit, [])
        if info is not None and info.status.is_terminal():
            return info
        time.sleep(0.5)
    raise AssertionError(f"job {sid} did not end in 120 s")


def test_a_job_ray_could_not_set_up_is_sent_again_once_then_its_failure_stands(
    ctx: context.Context, head: tuple[HeadMeta, NodeEndpoint]
) -> None:
    client = NodeClient(head[1])
    ctx.ledger.create_run(ledger_run("r1", LocalSection(), RunState.PREPARING), [])
    sid, sent = "r1-1-fetch", []

    def submit() -> None:  # as NodeClient.submit sends it, with a runtime environment the node cannot make
        sent.append(sid)
        client._ray().submit_job(entrypoint="echo ran", submission_id=sid, runtime_env=NO_SUCH_PACKAGE)

    info = until_ended(ctx, client, sid, submit)
    assert info.status == JobStatus.FAILED and info.never_ran, info
    assert "runtime_env setup failed" in info.message and info.exit_code is None
    assert len(sent) == 2  # the first failure sent it again (the node forgot it: the same id was taken)
    assert ctx.ledger.get_run("r1").resent == [sid]
    retrying = [e.data for _, e in read_run(ctx.redis, "r1") if e.type == EventType.RUN_RETRYING]
    assert len(retrying) == 1 and isinstance(retrying[0], RunRetrying)
    assert retrying[0].error == "RuntimeEnvSetupError" and retrying[0].stage.value == "prepare"
    why = retrying[0].why  # what failed, and the end of Ray's traceback: why
    assert why.startswith(f"Ray job {sid} never ran: OSError: Failed to download runtime_env file package")

    # A job whose command ran and failed is the job's own failure: not sent again.
    ran, tries = "r1-1-check", []

    def failing() -> None:
        tries.append(ran)
        client.submit(ran, "exit 3", {})

    info = until_ended(ctx, client, ran, failing)
    assert info.status == JobStatus.FAILED and not info.never_ran and info.exit_code == 3, info
    assert tries == [ran] and ctx.ledger.get_run("r1").resent == [sid]


READER = """
import json, sys
from providers.base import NodeEndpoint
from providers.node import NodeClient
url, token, sid = sys.argv[1:]
client = NodeClient(NodeEndpoint(url, url, {"Authorization": f"Bearer {token}"}))
info = client.info(sid)
print(json.dumps({
    "status": info.status.value, "exit_code": info.exit_code, "logs": client.logs(sid),
    "unknown": client.info("no-such-job"), "stopped": client.stop("no-such-job"),
    "ray_imported": sorted(m for m in sys.modules if m == "ray" or m.startswith("ray.")),
}))
"""


def test_reading_a_job_needs_no_ray_on_the_fleets_side(head: tuple[HeadMeta, NodeEndpoint]) -> None:
    """A watcher only reads jobs: the Jobs API's REST calls, not Ray's client, whose import costs a worker
    seconds of CPU (a `fleet run`'s first look at a job waited on it). What it reads is what Ray says."""
    client = NodeClient(head[1])
    sid = "light-1"
    client.submit(sid, "echo read-me; exit 4", {})
    deadline = time.monotonic() + 60
    while (info := client.info(sid)) is None or not info.status.is_terminal():
        assert time.monotonic() < deadline, info
        time.sleep(0.2)
    token = head[1].headers["Authorization"].removeprefix("Bearer ")
    argv = [sys.executable, "-c", READER, head[1].jobs_url, token, sid]
    read = json.loads(subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True).stdout)
    assert read["status"] == "FAILED" and read["exit_code"] == 4 and "read-me" in read["logs"], read
    assert read["unknown"] is None and read["stopped"] is False
    assert read["ray_imported"] == [], read["ray_imported"][:5]
