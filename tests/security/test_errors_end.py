"""Finding 11 and part of 10 (issue 19): every error a stage raises ends somewhere, every task has a time
limit, and the reaper enforces the per-run dollar cap.

- A refused API key (the fake RunPod answers 401) fails the run at once, AUTH_FAILED, with RunPod's words
  and never the key (it used to stay PROVISIONING for ever: the teardown of the failed run raised the same
  AuthFailed, so the run never ended and the reaper re-kicked it every pass).
- An error that may pass is retried with back-off, each failure a `run.retrying` event saying why, and
  the run fails once the bound (FLEET_RETRY_FOR_S) is reached.
- A step that hangs past its task's soft time limit is retried the same way, never a silent death.
  These three run `fleet run` against the fake RunPod's own process: a real Celery worker and Redis.
- The reaper fails a run whose nodes cost the cap (OVER_BUDGET), terminates its node and fences off the
  task inside its long step; and a run whose re-sent tasks keep dying fails STALLED instead of being
  kicked for ever.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from core.errors import FailureReason, LeaseLost
from state.events import read_run
from state.keys import tick_key
from state.ledger import fenced
from state.models import InstanceState, Run
from state.payloads import RunKicked
from state.stages import RunState, Stage
from tests.factories import RUNPOD_SECTION, light_job_file
from tests.fakes import FakeRunPod
from tests.faults.case import Case
from tests.faults.direct import DirectFleet, StageTask, _Request, up
from tests.integration.clouds import API_KEY, serving
from tests.integration.fleetproc import cleanup, events_of, fleet, fleet_env, secret_hits
from workers import context
from workers.runner import run_stage
from workers.stage import Next
from workers.stages.reap import reap_once

pytestmark = pytest.mark.timeout(240)

WRONG_KEY = "rpa_wrongkey0123456789abcdefghij"


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "fleet"
    home.mkdir()
    yield home
    assert cleanup(home) == []


@pytest.fixture
def fake_runpod(tmp_path: Path) -> Iterator[str]:
    with serving("runpod", tmp_path / "fake", API_KEY) as url:
        yield url


def add_faults(url: str, rules: list[dict[str, Any]]) -> None:
    body = json.dumps(rules).encode()
    urllib.request.urlopen(urllib.request.Request(f"{url}/_fake/faults", data=body), timeout=10).close()


def run_on_runpod(home: Path, url: str, tmp_path: Path, key: str, **settings: str) -> tuple[str, float]:
    """`fleet run` of the light job on the fake RunPod; (the run id, seconds it took)."""
    job = light_job_file(tmp_path / "job", RUNPOD_SECTION)
    env = fleet_env(home, RUNPOD_API_BASE_URL=url, RUNPOD_API_KEY=key, **settings)
    started = time.monotonic()
    done = fleet(env, "run", str(job), "--json", timeout=180)
    took = time.monotonic() - started
    assert key not in done.stdout + done.stderr
    view = json.loads(done.stdout)
    return str(view["run_id"]), took


def test_a_refused_api_key_fails_the_run_at_once_with_auth_failed(
    home: Path, fake_runpod: str, tmp_path: Path
) -> None:
    run_id, took = run_on_runpod(home, fake_runpod, tmp_path, WRONG_KEY)
    evs = events_of(home, run_id)
    kinds = [e["type"] for e in evs]
    assert kinds[-1] == "run.failed", kinds
    failed = evs[-1]["data"]
    assert failed["reason"] == FailureReason.AUTH_FAILED
    assert "RunPod refused the API key (HTTP 401): Unauthorized" in failed["message"]  # RunPod's words
    assert "run.kicked" not in kinds and "run.retrying" not in kinds  # not retried: it cannot pass
    assert took < 60  # the worker's start included; the old code never ended the run
    assert secret_hits(home, WRONG_KEY) == []


def test_an_error_that_may_pass_is_retried_saying_why_then_fails_at_the_bound(
    home: Path, fake_runpod: str, tmp_path: Path
) -> None:
    add_faults(fake_runpod, [{"op": "list", "kind": "500", "times": 1000}])
    run_id, _took = run_on_runpod(home, fake_runpod, tmp_path, API_KEY, FLEET_RETRY_FOR_S="4")
    evs = events_of(home, run_id)
    retrying = [e["data"] for e in evs if e["type"] == "run.retrying"]
    assert len(retrying) >= 2, [e["type"] for e in evs]
    assert [r["attempt"] for r in retrying] == list(range(1, len(retrying) + 1))
    first = retrying[0]
    assert first["stage"] == "provision" and first["error"] == "ProviderUnavailable"
    assert "RunPod API 500" in first["why"] and 0 <= first["retry_in_s"] <= 4
    (failed,) = [e["data"] for e in evs if e["type"] == "run.failed"]
    assert failed["reason"] == FailureReason.PROVISIONING_FAILED
    assert failed["message"].startswith(f"gave up after {len(retrying) + 1} failures in ")
    assert "RunPod API 500" in failed["message"]
    # The bound: the run failed once FLEET_RETRY_FOR_S had passed since the first failure, not long after.
    failed_at = next(e["time"] for e in evs if e["type"] == "run.failed")
    first_failure = first["gives_up_at"] - 4
    assert 4 <= failed_at - first_failure < 12
    assert secret_hits(home, API_KEY) == []


def test_a_step_past_its_soft_time_limit_is_retried_not_lost(
    home: Path, fake_runpod: str, tmp_path: Path
) -> None:
    # Every offer search hangs 30 s; the provider's own timeout (60 s) is far above the task's soft limit.
    # (Listing and terminating answer, so the run's teardown is quick; with no settle time after a create
    # call that had no answer, each try searches again.)
    add_faults(fake_runpod, [{"op": "search", "kind": "timeout", "delay": 30, "times": 50}])
    run_id, took = run_on_runpod(
        home, fake_runpod, tmp_path, API_KEY, FLEET_CREATE_SETTLE_S="0",
        FLEET_PROVISION_TIME_LIMIT_S="2", FLEET_TIME_LIMIT_GRACE_S="10", FLEET_RETRY_FOR_S="5",
    )  # fmt: skip
    evs = events_of(home, run_id)
    retrying = [e["data"] for e in evs if e["type"] == "run.retrying"]
    assert retrying and all(r["error"] == "StepTimedOut" for r in retrying), retrying
    assert "the provision step ran past its soft time limit (2 s)" in retrying[0]["why"]
    (failed,) = [e["data"] for e in evs if e["type"] == "run.failed"]
    assert failed["reason"] == FailureReason.PROVISIONING_FAILED
    assert "gave up after" in failed["message"] and "soft time limit" in failed["message"]
    assert took < 60  # never 30 s a search, nor a task killed and kicked


# The reaper, in this process against a real Redis and the in-process fake RunPod (tests.faults.direct).


def test_the_reaper_fails_a_run_at_the_dollar_cap_during_a_long_step(
    case: Case,
    redis_client: redis.Redis[str],
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = case.cloud(FakeRunPod, tmp_path / "fake", nodes="stub")
    direct = DirectFleet(case, redis_url, tmp_path / "fleet", [fake], monkeypatch, **proxied(fake))
    run_id = direct.submit(light_job_file(tmp_path / "job", RUNPOD_SECTION))
    case.expect(run_id, RunState.FAILED)
    direct.drive(run_id, until=up)
    run = direct.ctx.ledger.get_run(run_id)
    assert run.state == RunState.PREPARING and run.instance is not None
    # The prepare task sent last is inside a long step (an upload): it holds the run's claim.
    holder = direct.ctx.dispatcher.owner(run_id)
    assert holder is not None and direct.ctx.dispatcher.claim(run_id, holder)
    # Its node has been up an hour at its price by now: more than the cap.
    node = direct.ctx.ledger.get_instance(run.instance)
    assert node is not None and node.price_per_hour is not None
    direct.ctx.ledger.update_instance(run.instance, created_at=time.time() - 3600)
    capped = direct.settings.model_copy(update={"max_dollars_per_run": node.price_per_hour * 0.9})
    reaper = context.init(capped, redis_url)

    report = reap_once(reaper)

    run = reaper.ledger.get_run(run_id)
    assert run.state == RunState.FAILED and run.failure_reason == FailureReason.OVER_BUDGET, run.state
    assert report is not None and report.over_budget == [run_id]
    assert "FLEET_MAX_DOLLARS_PER_RUN" in (run.failure_message or "")
    record = reaper.ledger.get_instance(run.instance or "")
    assert record is not None and record.state in (InstanceState.TERMINATING, InstanceState.TERMINATED)
    assert fake.state()["instances"] == []  # terminated through the runner's own teardown
    # The task in its long step is fenced off: its next write to the run is refused.
    with fenced(run_id, holder), pytest.raises(LeaseLost):
        reaper.ledger.update_run(run_id, lambda r: [])
    case.check()


def proxied(fake: FakeRunPod) -> dict[str, Any]:
    """The settings that reach the fake's pods through its HTTPS proxy, as RunPod's are reached."""
    return {name.removeprefix("FLEET_").lower(): value for name, value in fake.proxy.settings().items()}


class Killed(BaseException):
    """What a task killed at its hard time limit looks like from here: nothing of it runs on."""


def test_a_run_whose_resent_tasks_keep_dying_fails_stalled(
    case: Case,
    redis_client: redis.Redis[str],
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = case.cloud(FakeRunPod, tmp_path / "fake", nodes="stub")
    direct = DirectFleet(
        case, redis_url, tmp_path / "fleet", [fake], monkeypatch, stalled_after_kicks=2, **proxied(fake)
    )
    ctx = direct.ctx
    run_id = direct.submit(light_job_file(tmp_path / "job", RUNPOD_SECTION))
    case.expect(run_id, RunState.FAILED)
    direct.drive(run_id, until=up)

    def dies(_ctx: context.Context, _run: Run) -> Next:
        raise Killed

    kicks = 0
    for _ in range(6):
        ctx.redis.delete(tick_key(run_id))  # the dead task's claim expired
        report = reap_once(ctx)
        assert report is not None
        if ctx.ledger.get_run(run_id).state.is_terminal():
            break
        assert report.kicked == [run_id]
        kicks += 1
        kicked = ctx.dispatcher.owner(run_id)  # the task the reaper sent: it starts, and dies mid-step
        assert kicked is not None
        with pytest.raises(Killed):
            run_stage(StageTask(_Request(kicked, 0)), run_id, Stage.PREPARE, dies)
    run = ctx.ledger.get_run(run_id)
    assert run.state == RunState.FAILED and run.failure_reason == FailureReason.STALLED, run.state
    assert report.stalled == [run_id] and kicks == 2
    assert "FLEET_STALLED_AFTER_KICKS=2" in (run.failure_message or "")
    kicked_events = [e.data for _id, e in read_run(ctx.redis, run_id) if isinstance(e.data, RunKicked)]
    assert [k.kick for k in kicked_events] == [1, 2]
    assert fake.state()["instances"] == []
    case.check()


def test_a_step_that_gets_through_clears_the_kicks(
    case: Case,
    redis_client: redis.Redis[str],
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run kicked because its queue was busy (its task waited) is not stalled: its task gets through."""
    fake = case.cloud(FakeRunPod, tmp_path / "fake", nodes="stub")
    direct = DirectFleet(
        case, redis_url, tmp_path / "fleet", [fake], monkeypatch, stalled_after_kicks=1, **proxied(fake)
    )
    ctx = direct.ctx
    run_id = direct.submit(light_job_file(tmp_path / "job", RUNPOD_SECTION))
    case.expect(run_id, RunState.CANCELLED)
    direct.drive(run_id, until=up)
    for _ in range(3):
        ctx.redis.delete(tick_key(run_id))
        assert reap_once(ctx).kicked == [run_id]  # type: ignore[union-attr]
        run_stage(StageTask(_Request(ctx.dispatcher.owner(run_id) or "", 0)), run_id, Stage.PREPARE, poll)
        run = ctx.ledger.get_run(run_id)
        assert run.state == RunState.PREPARING and run.kicks == run.kicked_starts == 0
    direct.cancel(run_id)
    direct.drive(run_id, until=lambda r: False)
    case.check()


def poll(_ctx: context.Context, _run: Run) -> Next:
    return Next.poll(Stage.PREPARE, 0.1)
