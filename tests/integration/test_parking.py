"""Parked runs (broker.parking, workers.watcher): a run that waits on its node costs no Celery task until
something happens; the watcher hands it back to its stage's task once, another watcher takes over when it
dies, and a run is never parked without a watcher to look at it. (A whole run parked, relayed by the
watcher: tests/integration/test_replay_nodes.py.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from broker.dispatch import Dispatcher
from broker.parking import WATCHER, Watch
from core.settings import Settings
from jobs.sections import LocalSection
from state.keys import PARKED, WATCHER_LEASE, tick_key
from state.stages import RunState, Stage
from tests.factories import RecordingApp, ledger_run
from tests.integration.fleetproc import wait_until
from workers import context, watcher


def _watch(until_s: float = 60.0) -> Watch:
    return Watch(stage=Stage.TRAIN, until=time.time() + until_s, job="r1-1-train", relay=True)


def test_a_run_parks_only_while_a_watcher_looks_and_is_woken_once(redis_client: redis.Redis[str]) -> None:
    app = RecordingApp()
    dispatcher = Dispatcher(app, redis_client, stall_after_s=30)
    assert dispatcher.send(Stage.TRAIN, "r1", after=None)
    task = app.sent[0][1]["task_id"]
    assert not dispatcher.park("r1", task, _watch())  # no watcher: the task polls instead
    assert dispatcher.owner("r1") == task and not redis_client.hexists(PARKED, "r1")

    redis_client.set(WATCHER_LEASE, "w", px=10_000)
    assert not dispatcher.park("r1", "another-task", _watch())  # only the run's owner parks it
    watch = _watch()
    assert dispatcher.park("r1", task, watch)
    assert dispatcher.owner("r1") == WATCHER
    assert dispatcher.parking.parked() == {"r1": watch}
    # Parked: no stage task may be sent for it by anyone else (a cancel, the reaper's kick)...
    assert not dispatcher.send(Stage.TRAIN, "r1", after=None)
    # ...and the watcher's wake sends one task, once, however many ask.
    assert dispatcher.wake(Stage.TRAIN, "r1")
    assert not dispatcher.wake(Stage.TRAIN, "r1")
    assert [name for name, _ in app.sent] == [Stage.TRAIN.task_name] * 2
    woken = app.sent[1][1]["task_id"]
    assert dispatcher.owner("r1") == woken and dispatcher.parking.parked() == {}


def test_the_watcher_renews_what_it_holds_and_lets_go_of_the_rest(redis_client: redis.Redis[str]) -> None:
    app = RecordingApp()
    dispatcher = Dispatcher(app, redis_client, stall_after_s=30)
    redis_client.set(WATCHER_LEASE, "w", px=10_000)
    for run_id in ("r1", "r2"):
        dispatcher.send(Stage.TRAIN, run_id, after=None)
        assert dispatcher.park(run_id, app.sent[-1][1]["task_id"], _watch())
    redis_client.pexpire(tick_key("r1"), 500)
    # The reaper took r2 over (its dollar cap): the watcher must not renew it, nor look at it again.
    redis_client.set(tick_key("r2"), "reaper-x", px=30_000)
    assert dispatcher.parking.renew(["r1", "r2"]) == ["r2"]
    assert redis_client.pttl(tick_key("r1")) > 20_000
    assert redis_client.get(tick_key("r2")) == "reaper-x"
    assert list(dispatcher.parking.parked()) == ["r1"]


@pytest.fixture
def ctx(redis_client: redis.Redis[str], redis_url: str, fleet_home: Path) -> Iterator[context.Context]:
    from broker.app import configure

    settings = Settings(home=fleet_home, poll_interval_s=0.2)
    configure(settings, redis_url)
    yield context.init(settings, redis_url)


def _parked_run(ctx: context.Context, until_s: float, run_id: str = "r1") -> Watch:
    """A run in TRAINING, parked by its task on `until_s` from now (no job: only its deadline wakes it)."""
    ctx.ledger.create_run(ledger_run(run_id, LocalSection(), RunState.TRAINING), [])
    ctx.redis.set(tick_key(run_id), "its-task", px=30_000)  # the task that parks it
    watch = Watch(stage=Stage.TRAIN, until=time.time() + until_s)
    assert ctx.dispatcher.park(run_id, "its-task", watch)
    return watch


def test_one_watcher_looks_another_takes_over_and_a_parked_run_is_woken_once(
    ctx: context.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watcher, "LEASE_TTL_S", 1.5)  # a dead watcher's lease goes in 1.5 s, not 15
    first, second = watcher.Watcher(ctx, "first"), watcher.Watcher(ctx, "second")
    stop_first, stop_second = threading.Event(), threading.Event()
    threading.Thread(target=first.serve, args=(stop_first,), daemon=True).start()
    wait_until(lambda: ctx.redis.exists(WATCHER_LEASE), 5, "a watcher to take the lease")
    threading.Thread(target=second.serve, args=(stop_second,), daemon=True).start()
    try:
        assert str(ctx.redis.get(WATCHER_LEASE)).startswith("first:")
        _parked_run(ctx, until_s=1.0)
        # Parked: the watcher renews its claim and sends nothing until its deadline...
        time.sleep(0.6)
        assert ctx.dispatcher.owner("r1") == WATCHER and ctx.redis.llen(Stage.TRAIN.value) == 0
        # ...then the train task, once.
        wait_until(lambda: ctx.redis.llen(Stage.TRAIN.value) == 1, 5, "the parked run's task")
        assert ctx.dispatcher.owner("r1") not in (None, WATCHER) and ctx.dispatcher.parking.parked() == {}
        time.sleep(0.6)
        assert ctx.redis.llen(Stage.TRAIN.value) == 1

        # The first watcher dies: its lease outlives it (unrenewed, as a killed process's), then the second
        # takes over.
        stop_first.set()
        ctx.redis.set(WATCHER_LEASE, "first:dead", px=1500)
        wait_until(lambda: str(ctx.redis.get(WATCHER_LEASE)).startswith("second:"), 10, "the second")
        _parked_run(ctx, until_s=0.5, run_id="r2")
        wait_until(lambda: ctx.redis.llen(Stage.TRAIN.value) == 2, 5, "the second watcher's wake")
        assert ctx.dispatcher.owner("r2") not in (None, WATCHER)
    finally:
        stop_first.set()
        stop_second.set()


def test_a_cancel_wakes_a_parked_run_at_once(ctx: context.Context, redis_url: str) -> None:
    from service.runs import Fleet, cancel

    ctx.redis.set(WATCHER_LEASE, "w", px=30_000)  # a watcher looks (not this test's business here)
    _parked_run(ctx, until_s=300)
    cancel(Fleet(ctx.world, redis_url, ctx.redis, ctx.ledger, ctx.dispatcher), "r1")
    assert ctx.redis.llen(Stage.TRAIN.value) == 1  # its task, which sees the flag and tears it down
    assert ctx.dispatcher.parking.parked() == {}
