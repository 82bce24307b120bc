"""The fleet's own code called in this process, for cases that need no training: provider and stage calls
against a real Redis and in-process fake clouds, and `workers.stages.reap.reap_once`, as test_reap.py does.

`DirectFleet.drive` plays the Celery worker for one run: it calls the real stage task body
(`workers.runner.run_stage`, so claiming, cancelling, teardown and Retry-After are the fleet's own) with
the task's id and retry count, and retries what Celery's autoretry would, after the same back-off
(`RETRY_POLICY`, Celery's own jittered interval, seeded per case). What it leaves out is only the broker
round trip: the next task is run here instead of being consumed from the queue it was sent to.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from celery.utils.time import get_exponential_backoff_interval

from broker.app import configure
from core.errors import FleetError
from jobs.spec import load_job
from providers.base import Provider
from providers.registry import FleetSettings
from service import runs
from state.models import Run
from state.stages import RunState, Stage
from tests.fakes import FakeCloud, FakeRunPod
from tests.faults.canaries import CANARIES
from tests.faults.case import Case
from tests.integration.fleetproc import NOWHERE
from workers import context
from workers.runner import run_stage
from workers.stage import RETRY_POLICY, Next
from workers.stages import finalize, prepare, provision, train
from workers.stages.reap import reap_once

STEPS: dict[Stage, Callable[[context.Context, Run], Next]] = {
    Stage.PROVISION: provision.step,
    Stage.PREPARE: prepare.step,
    Stage.TRAIN: train.step,
    Stage.FINALIZE: finalize.step,
}
URL_SETTING = {"runpod": "runpod_api_base_url", "vastai": "vast_url"}


class Retried(Exception):
    """What `task.retry()` raises in the real worker: send this task again after `countdown`."""

    def __init__(self, countdown: float) -> None:
        super().__init__(f"retry in {countdown} s")
        self.countdown = countdown


@dataclass
class _Request:
    id: str
    retries: int


@dataclass
class StageTask:
    """The part of a bound Celery task that `run_stage` uses."""

    request: _Request
    max_retries: int = int(RETRY_POLICY["max_retries"])

    def retry(self, exc: BaseException | None = None, countdown: float | None = None) -> Retried:
        return Retried(countdown or 0.0)


@dataclass
class Drive:
    """What one `drive` did: the stage tasks run, and the retries Celery would have scheduled."""

    tasks: int = 0
    retries: list[tuple[str, float]] = field(default_factory=list)


class DirectFleet:
    """One case's fleet in this process: settings for its fake clouds, a worker's context, the reaper."""

    def __init__(
        self,
        case: Case,
        redis_url: str,
        home: Path,
        clouds: Sequence[FakeCloud],
        monkeypatch: pytest.MonkeyPatch,
        **settings: Any,
    ) -> None:
        for name, value in CANARIES.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("FLEET_SECRETS_FILE", str(home / "no-secrets.yml"))
        urls = {setting: NOWHERE for setting in URL_SETTING.values()}
        urls.update({URL_SETTING[fake.vendor]: fake.url for fake in clouds})
        for fake in clouds:  # a RunPod pod's Jobs API is reached only through (the fake of) RunPod's proxy
            urls.update(fake.proxy.values() if isinstance(fake, FakeRunPod) else {})
        # A create with no clear answer is only looked up for create_settle_s (the fakes show a late
        # create within seconds; the default, 2 min, is for real clouds).
        defaults: dict[str, Any] = {
            "orphan_grace_s": 0,
            "poll_interval_s": 0.2,
            "stall_after_s": 30,
            "create_settle_s": 5,
            "reap_interval_s": 1,  # the pace at which the cases call the reaper (its back-offs scale)
        }
        self.settings = FleetSettings(home=home, **{**defaults, **urls, **settings})
        configure(self.settings, redis_url)
        self.ctx = context.init(self.settings, redis_url)
        self.fleet = runs.Fleet(
            self.ctx.world, redis_url, self.ctx.redis, self.ctx.ledger, self.ctx.dispatcher
        )
        self.rng = random.Random(case.name)
        self.case = case
        for fake in clouds:
            case.watch_cloud(fake)
        case.watch_redis(lambda: redis_url)
        case.reaper = lambda: reap_once(self.ctx)
        case.settle_s = 10.0

    def provider(self, name: str) -> Provider:
        return self.ctx.provider(name)

    def client_timeout(self, name: str, seconds: float) -> None:
        """Shorten the provider's HTTP timeout (30 s in the fleet), so a 'timeout' fault is one in seconds."""
        client: Any = getattr(self.provider(name), "client")  # noqa: B009 - RemoteProvider's wire client
        if hasattr(client, "timeout_s"):
            client.timeout_s = seconds  # RunPodClient
        else:
            client._vast.client.timeout = seconds  # vastai's own client, under VastAIClient

    def submit(self, job: Path) -> str:
        """`fleet enqueue`'s service call: the run is QUEUED and its provision task sent."""
        run = runs.submit(self.fleet, load_job(job, default_provider=self.settings.default_provider))
        return run.run_id

    def cancel(self, run_id: str) -> None:
        runs.cancel(self.fleet, run_id)

    def drive(self, run_id: str, until: Callable[[Run], bool], timeout_s: float = 60) -> Drive:
        """Run the run's stage tasks here until `until(run)` or the run ended."""
        done = Drive()
        retries = 0
        deadline = time.monotonic() + timeout_s
        while True:
            run = self.ctx.ledger.get_run(run_id)
            if until(run) or run.state.is_terminal():
                return done
            assert time.monotonic() < deadline, f"run {run_id} still {run.state} after {timeout_s} s: {done}"
            stage = run.state.stage
            assert stage is not None
            task_id = self.ctx.dispatcher.owner(run_id) or uuid.uuid4().hex  # the task sent, or a kick
            done.tasks += 1
            try:
                run_stage(StageTask(_Request(task_id, retries)), run_id, stage, STEPS[stage])
            except Retried as retry:  # the provider said when (Retry-After)
                wait: float = retry.countdown
            except FleetError as exc:  # Celery's autoretry_for: jittered exponential back-off
                if not exc.retryable:
                    raise
                wait = self._backoff(retries)
            else:
                retries = 0
                time.sleep(self.settings.poll_interval_s)
                continue
            done.retries.append((stage.value, wait))
            retries += 1
            time.sleep(wait)

    def _backoff(self, retries: int) -> float:
        """Celery's own countdown for RETRY_POLICY, with this case's seeded randomness."""
        state = random.getstate()
        random.seed(self.rng.random())
        try:
            return float(
                get_exponential_backoff_interval(
                    factor=int(RETRY_POLICY["retry_backoff"]),
                    retries=retries,
                    maximum=int(RETRY_POLICY["retry_backoff_max"]),
                    full_jitter=bool(RETRY_POLICY["retry_jitter"]),
                )
            )
        finally:
            random.setstate(state)


def up(run: Run) -> bool:
    """Provisioned: the node answered and the run moved on to prepare."""
    return run.state == RunState.PREPARING
