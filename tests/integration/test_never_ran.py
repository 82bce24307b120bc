"""A Ray job that Ray fails before its command starts (it could not set up the job's runtime environment)
is forgotten on the node and sent again, once, under the same id, with a `run.retrying` event; a second
such failure ends the job, and a job whose command ran and failed is never sent again. On a real Ray head:
the broken runtime environment is a working_dir the head's package store does not hold."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from broker.events import read_run
from broker.models import RunState
from broker.payloads import EventType, RunRetrying
from core.settings import Settings
from jobs.sections.local import LocalSection
from providers.base import NodeEndpoint
from providers.local.client import HeadMeta
from providers.node import JobInfo, JobStatus, NodeClient
from tests.factories import ledger_run
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
        client._client.submit_job(entrypoint="echo ran", submission_id=sid, runtime_env=NO_SUCH_PACKAGE)

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
