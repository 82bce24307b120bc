"""The ledger, the event stream and the dispatcher against a real Redis server."""

from __future__ import annotations

import threading

import pytest
import redis

from broker.dispatch import Dispatcher
from core.errors import AlreadyExists, NotFound
from jobs.sections import ProviderName
from state import events
from state.keys import tick_key
from state.ledger import Draft, Ledger
from state.models import Instance, InstanceState, Run
from state.payloads import EventType, RunQueued, StageStarted, TrainStep
from state.stages import RunState, Stage
from tests.factories import RecordingApp, job_spec


def make_run(run_id: str = "r1") -> Run:
    return Run(
        run_id=run_id, provider="local", source="t.yml", spec=job_spec(), run_dir="/x", output_dir="/x/o"
    )


def test_create_and_update_write_events_with_the_state(redis_client: redis.Redis[str]) -> None:
    ledger = Ledger(redis_client)
    ledger.create_run(make_run(), [RunQueued(source="t.yml", provider=ProviderName.LOCAL)])

    def move(run: Run) -> list[Draft]:
        run.state = RunState.PROVISIONING
        return [StageStarted(stage=Stage.PROVISION)]

    ledger.update_run("r1", move)
    assert ledger.get_run("r1").state == RunState.PROVISIONING
    got = [e for _, e in events.read_run(redis_client, "r1")]
    assert [e.type for e in got] == [EventType.RUN_QUEUED, EventType.STAGE_STARTED]
    assert [e.id for e in got] == ["r1-1", "r1-2"]  # stable ids: consumers dedupe on them
    assert redis_client.xlen("tf:events") == 2


def test_a_taken_run_id_is_refused_and_nothing_is_written(redis_client: redis.Redis[str]) -> None:
    # Two submits that drew the same id: the second must not overwrite the first (and its events).
    ledger = Ledger(redis_client)
    first = ledger.create_run(make_run(), [RunQueued(source="first.yml", provider=ProviderName.LOCAL)])
    with pytest.raises(AlreadyExists):
        ledger.create_run(make_run(), [RunQueued(source="second.yml", provider=ProviderName.LOCAL)])
    assert ledger.get_run(first.run_id).source == first.source
    (only,) = events.read_run(redis_client, first.run_id)
    assert only[1].data.source == "first.yml"  # type: ignore[union-attr]


def test_concurrent_updates_never_lose_one(redis_client: redis.Redis[str], redis_url: str) -> None:
    ledger = Ledger(redis_client)
    ledger.create_run(make_run(), [])

    def bump(run: Run) -> list[Draft]:
        run.log_offset += 1
        return [TrainStep(step=run.log_offset)]

    def worker() -> None:
        other = Ledger(redis.Redis.from_url(redis_url, decode_responses=True))
        for _ in range(25):
            other.update_run("r1", bump)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run = ledger.get_run("r1")
    assert run.log_offset == 100
    steps = [e.data.step for _, e in events.read_run(redis_client, "r1") if isinstance(e.data, TrainStep)]
    assert steps == list(range(1, 101))


def test_find_run_by_prefix_and_missing(redis_client: redis.Redis[str]) -> None:
    ledger = Ledger(redis_client)
    ledger.create_run(make_run("261129-101010-abcd"), [])
    ledger.create_run(make_run("261129-101010-abff"), [])
    assert ledger.find_run("261129-101010-abc").run_id == "261129-101010-abcd"
    with pytest.raises(NotFound, match="matches 2 runs"):
        ledger.find_run("261129-101010-ab")
    with pytest.raises(NotFound):
        ledger.get_run("nope")
    assert [r.run_id for r in ledger.list_runs()] == ["261129-101010-abff", "261129-101010-abcd"]


def test_instances_round_trip(redis_client: redis.Redis[str]) -> None:
    ledger = Ledger(redis_client)
    ledger.put_instance(Instance(name="tf-r1-1", provider="local", run_id="r1"))
    updated = ledger.update_instance("tf-r1-1", state=InstanceState.RUNNING)
    assert updated is not None and updated.state == InstanceState.RUNNING
    assert [i.name for i in ledger.list_instances()] == ["tf-r1-1"]
    assert ledger.update_instance("tf-missing-1", state=InstanceState.RUNNING) is None


def test_consumer_group_redelivers_unacked_after_restart(redis_client: redis.Redis[str]) -> None:
    ledger = Ledger(redis_client)
    queued = RunQueued(source="t.yml", provider=ProviderName.LOCAL)
    ledger.create_run(make_run(), [queued, StageStarted(stage=Stage.PROVISION)])
    first = events.EventConsumer(redis_client, "notifier", "c1")
    got = first.read(block_ms=100)
    assert [e.type for _, e in got] == [EventType.RUN_QUEUED, EventType.STAGE_STARTED]
    first.ack(got[0][0])  # the second one is "in flight" when the consumer dies
    again = events.EventConsumer(redis_client, "notifier", "c1")
    redelivered = again.read(block_ms=100)
    assert [e.type for _, e in redelivered] == [EventType.STAGE_STARTED]
    again.ack(redelivered[0][0])
    assert again.read(block_ms=100) == []  # pending done, nothing new


def test_dispatcher_keeps_one_chain_per_run(redis_client: redis.Redis[str]) -> None:
    app = RecordingApp()
    dispatcher = Dispatcher(app, redis_client, stall_after_s=30)
    assert dispatcher.send(Stage.PROVISION, "r1", after=None)
    assert not dispatcher.send(Stage.PROVISION, "r1", after=None)  # someone owns it
    first_id = app.sent[0][1]["task_id"]
    assert dispatcher.claim("r1", first_id)
    assert not dispatcher.claim("r1", "a-duplicate-delivery")
    assert dispatcher.send(Stage.PREPARE, "r1", after=first_id)
    second_id = app.sent[1][1]["task_id"]
    # The first task, delivered again after it handed over, can neither act nor fork the chain.
    assert not dispatcher.claim("r1", first_id)
    assert not dispatcher.send(Stage.PREPARE, "r1", after=first_id)
    assert dispatcher.owner("r1") == second_id
    assert len(app.sent) == 2
    # Once the owner's lease expires (a dead worker), anyone may restart the chain.
    redis_client.delete(tick_key("r1"))
    assert dispatcher.send(Stage.PREPARE, "r1", after=None)


def test_each_stage_task_lands_in_its_own_queue_only(redis_client: redis.Redis[str], redis_url: str) -> None:
    from broker.app import app, configure
    from broker.queues import QUEUES, REAP_TASK
    from core.settings import Settings

    configure(Settings(), redis_url)
    for stage in Stage:  # no queue given: the app's routes must pick it
        app.send_task(stage.task_name, args=["r1"])
    app.send_task(REAP_TASK)
    assert {q: redis_client.llen(q) for q in QUEUES} == dict.fromkeys(QUEUES, 1)


def test_configure_again_sends_to_the_new_redis(redis_url: str, redis_client: redis.Redis[str]) -> None:
    """A process that connects to another Redis (the bot's tests do, one fleet after another) must send its
    tasks there, not down the connection it opened to the first one."""
    from broker import app as broker_app
    from core.settings import Settings

    assert redis_url.endswith("?db=0"), redis_url  # the embedded Redis's socket, database 0
    other_url = redis_url.removesuffix("0") + "1"
    other = redis.Redis.from_url(other_url, decode_responses=True)
    other.flushdb()
    try:
        for url in (redis_url, other_url):
            broker_app.configure(Settings(), url).send_task(
                "trainfleet.provision", args=["r"], queue="provision"
            )
        assert redis_client.llen("provision") == 1 and other.llen("provision") == 1
    finally:
        other.flushdb()
        other.close()
        broker_app.configure(Settings(), redis_url)
