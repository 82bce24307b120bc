"""The reaper against a real Redis and real local Ray heads (called directly, as beat would)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from core.settings import Settings
from jobs.sections.local import LocalSection
from providers.base import LaunchRequest, NodeState
from providers.onnode import failsafe
from providers.registry import FleetSettings
from providers.runpod.section import RunPodSection
from state.events import read_run
from state.keys import tick_key
from state.models import Instance, InstanceState, Run
from state.stages import RunState, Stage
from tests.factories import ledger_run
from tests.fakes.runpod import FakeRunPod
from workers import context, ending
from workers.stages.reap import kick_record, reap_once

pytestmark = pytest.mark.integration


@pytest.fixture
def ctx(redis_client: redis.Redis[str], redis_url: str, fleet_home: Path) -> Iterator[context.Context]:
    from broker.app import configure

    settings = Settings(home=fleet_home, orphan_grace_s=0, stall_after_s=30)
    configure(settings, redis_url)
    ctx = context.init(settings, redis_url)
    yield ctx
    provider = ctx.provider("local")
    for name in provider.heads.names():  # type: ignore[attr-defined]
        provider.terminate(name)


def start_head(ctx: context.Context, name: str) -> None:
    provider = ctx.provider("local")
    provider.launch(LaunchRequest(name, name, LocalSection(num_cpus=1)))
    deadline = time.monotonic() + 60
    while (inst := provider.get(name)) is None or inst.state != NodeState.RUNNING:
        assert time.monotonic() < deadline, inst
        time.sleep(0.3)


def make_run(run_id: str, state: RunState) -> Run:
    return ledger_run(run_id, LocalSection(), state)


def test_reaper_terminates_orphans_and_spares_live_runs(ctx: context.Context) -> None:
    # An orphan: ours by name, but no ledger row (a crash between the create call and the ledger write).
    start_head(ctx, "tf-orphan-1")
    # A node whose run is still training: must be left alone.
    start_head(ctx, "tf-busy-1")
    ctx.ledger.create_run(make_run("busy", RunState.TRAINING), [])
    ctx.ledger.put_instance(
        Instance(name="tf-busy-1", provider="local", run_id="busy", state=InstanceState.RUNNING)
    )
    ctx.redis.set(tick_key("busy"), "someone", ex=30)  # its task chain is alive

    did = reap_once(ctx)

    assert did is not None and did.terminated == ["tf-orphan-1"]
    assert ctx.provider("local").get("tf-orphan-1") is None
    busy = ctx.provider("local").get("tf-busy-1")
    assert busy is not None and busy.state == NodeState.RUNNING
    assert did.kicked == []
    # The pass told the busy node the fleet is alive, in a way its failsafe counts (and nothing else does).
    meta = ctx.provider("local").heads.read("tf-busy-1")  # type: ignore[attr-defined]
    log = Path(meta.temp_dir) / "session_latest" / "logs" / "dashboard.log"
    assert len([line for line in log.read_text().splitlines() if failsafe.is_heartbeat(line)]) == 1
    # The orphan had no ledger record: it has one now, so the next passes can see it gone.
    assert reap_once(ctx).confirmed == ["tf-orphan-1"]  # type: ignore[union-attr]
    orphan = ctx.ledger.get_instance("tf-orphan-1")
    assert orphan is not None and orphan.state == InstanceState.TERMINATED


def test_reaper_restarts_a_run_whose_chain_died(ctx: context.Context) -> None:
    ctx.ledger.create_run(make_run("stuck", RunState.TRAINING), [])
    ctx.ledger.create_run(make_run("done", RunState.SUCCEEDED), [])
    did = reap_once(ctx)
    assert did is not None and did.kicked == ["stuck"]
    assert ctx.redis.llen(Stage.TRAIN.value) == 1  # its stage's task was sent again
    assert ctx.dispatcher.owner("stuck") is not None
    assert reap_once(ctx).kicked == []  # type: ignore[union-attr] # only once while that task owns it


def test_a_kick_is_not_recorded_on_a_run_its_task_already_ended(ctx: context.Context) -> None:
    # The reaper sends the task, then records the kick; under load the task can end the run in between (a
    # cancel asked for): the run's last event must stay its end (a CI run once saw run.kicked after it).
    ctx.ledger.create_run(make_run("ended", RunState.CANCELLED), [])
    ctx.ledger.create_run(make_run("stuck", RunState.PREPARING), [])
    for run_id in ("ended", "stuck"):
        ctx.ledger.update_run(run_id, kick_record(Stage.PREPARE, 3))
    assert ctx.ledger.get_run("ended").kicks == 0 and ctx.ledger.get_run("stuck").kicks == 1
    kicked = {
        r: [e for _, e in read_run(ctx.redis, r) if e.type.value == "run.kicked"] for r in ("ended", "stuck")
    }
    assert [len(events) for events in kicked.values()] == [0, 1]


def test_a_kick_is_recorded_before_its_task_is_sent(
    ctx: context.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Sent first, the task could end the run (a cancel asked for) before the kick was written: a CI run saw
    # a cancelled run with no run.kicked, another saw run.kicked after its end. Now nothing is sent before it.
    ctx.ledger.create_run(make_run("stuck", RunState.PREPARING), [])
    kicks_when_sent: list[int] = []
    send = ctx.dispatcher._send_task

    def watched(stage: Stage, run_id: str, task_id: str, countdown: float) -> None:
        kicks_when_sent.append(ctx.ledger.get_run(run_id).kicks)
        send(stage, run_id, task_id, countdown)

    monkeypatch.setattr(ctx.dispatcher, "_send_task", watched)
    assert reap_once(ctx).kicked == ["stuck"]  # type: ignore[union-attr]
    assert kicks_when_sent == [1] and ctx.redis.llen(Stage.PREPARE.value) == 1


def test_a_kick_the_run_outran_sends_nothing(ctx: context.Context) -> None:
    # The run left its stage between the reaper's look and its kick: no record, no task, the claim given back.
    ctx.ledger.create_run(make_run("moved", RunState.PREPARING), [])
    assert not ctx.dispatcher.kick(Stage.PREPARE, "moved", lambda: False)
    assert ctx.redis.llen(Stage.PREPARE.value) == 0 and ctx.dispatcher.owner("moved") is None
    ctx.redis.set(tick_key("moved"), "a-live-task")
    assert not ctx.dispatcher.kick(Stage.PREPARE, "moved", lambda: True)  # owned: never kicked
    assert ctx.dispatcher.owner("moved") == "a-live-task"


def test_one_reaper_at_a_time(ctx: context.Context) -> None:
    ctx.ledger.create_run(make_run("stuck", RunState.PREPARING), [])
    ctx.redis.set("tf:lock:reap", "another-reaper", ex=30)
    assert reap_once(ctx) is None  # it stood down
    assert ctx.redis.llen(Stage.PREPARE.value) == 0


def test_a_node_kept_for_debugging_lives_until_its_deadline(ctx: context.Context) -> None:
    start_head(ctx, "tf-kept-1")
    ctx.ledger.create_run(make_run("kept", RunState.FAILED), [])
    ctx.ledger.put_instance(
        Instance(
            name="tf-kept-1",
            provider="local",
            run_id="kept",
            state=InstanceState.RUNNING,
            keep_until=time.time() + 600,
        )
    )
    assert reap_once(ctx).terminated == []  # type: ignore[union-attr]
    assert ctx.provider("local").get("tf-kept-1") is not None
    ctx.ledger.update_instance("tf-kept-1", keep_until=time.time() - 1)
    assert reap_once(ctx).terminated == ["tf-kept-1"]  # type: ignore[union-attr]
    assert ctx.provider("local").get("tf-kept-1") is None


def test_a_node_both_its_run_and_the_reaper_see_gone_is_said_terminated_once(ctx: context.Context) -> None:
    # The run's stage terminated its node and waits on the provider's terminate; a reap pass meanwhile finds
    # the node no longer listed and confirms it first: the stage's confirmation after says nothing more.
    ctx.ledger.create_run(make_run("twice", RunState.SUCCEEDED), [])
    for name in ("tf-twice-1", "tf-twice-2"):
        ctx.ledger.put_instance(
            Instance(name=name, provider="local", run_id="twice", state=InstanceState.TERMINATING)
        )
    assert ending._gone(ctx, "local", "tf-twice-2") != []  # the stage first: it says so
    assert reap_once(ctx).confirmed == ["tf-twice-1"]  # type: ignore[union-attr]
    assert ending._gone(ctx, "local", "tf-twice-1") == []
    said = [e.data.instance for _, e in read_run(ctx.redis, "twice") if e.type.value == "instance.terminated"]  # type: ignore[attr-defined]
    assert said == ["tf-twice-1"]  # (the stage's drafts are the stage's to write: tf-twice-2's is not here)
    states = {n: ctx.ledger.get_instance(n).state for n in ("tf-twice-1", "tf-twice-2")}  # type: ignore[union-attr]
    assert set(states.values()) == {InstanceState.TERMINATED}


def test_a_pod_that_never_started_is_reaped_by_the_ledgers_age(
    redis_client: redis.Redis[str], redis_url: str, fleet_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RunPod dates a pod from its uptime: stuck before running, it looks brand new on every pass. The
    ledger's record of the create call says how old it really is."""
    from broker.app import configure

    with FakeRunPod(api_key="rp-key", home=fleet_home / "fake", nodes="none", ready_delay_s=3600) as fake:
        monkeypatch.setenv("RUNPOD_API_KEY", "rp-key")
        settings = FleetSettings(
            home=fleet_home, orphan_grace_s=60, runpod_api_base_url=fake.url, **fake.proxy.values()
        )
        configure(settings, redis_url)
        ctx = context.init(settings, redis_url)
        section = RunPodSection(gpu="NVIDIA RTX A5000")
        ctx.provider("runpod").launch(LaunchRequest("tf-stuck-1", "stuck", section))
        ctx.provider("runpod").launch(LaunchRequest("tf-fresh-1", "fresh", section))
        ctx.ledger.create_run(make_run("stuck", RunState.FAILED), [])
        ctx.ledger.put_instance(
            Instance(name="tf-stuck-1", provider="runpod", run_id="stuck", created_at=time.time() - 600)
        )
        ctx.ledger.create_run(make_run("fresh", RunState.FAILED), [])
        ctx.ledger.put_instance(Instance(name="tf-fresh-1", provider="runpod", run_id="fresh"))

        did = reap_once(ctx)

        assert did is not None and did.terminated == [
            "tf-stuck-1"
        ]  # within the grace window: tf-fresh-1 is left alone
        assert [r["name"] for r in fake.state()["instances"]] == ["tf-fresh-1"]


def test_a_pass_keeps_its_lock_while_a_provider_call_hangs(
    redis_client: redis.Redis[str], redis_url: str, fleet_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider's list call may hang until its timeout; the pass renews its lock meanwhile, so no other
    reaper starts a second pass beside it."""
    from broker.app import configure
    from state.keys import REAP_LOCK

    with FakeRunPod(api_key="rp-key", home=fleet_home / "fake", nodes="none") as fake:
        monkeypatch.setenv("RUNPOD_API_KEY", "rp-key")
        settings = FleetSettings(
            home=fleet_home, reap_interval_s=2, runpod_api_base_url=fake.url, **fake.proxy.values()
        )
        configure(settings, redis_url)
        ctx = context.init(settings, redis_url)
        fake.add_faults([{"op": "list", "kind": "hang", "delay": 5}])
        first = threading.Thread(target=reap_once, args=(ctx,))
        first.start()
        time.sleep(4.5)  # past a third of the lock's 10 s TTL: renewed once
        left_ms = redis_client.pttl(REAP_LOCK)
        assert reap_once(ctx) is None  # the lock is the first pass's
        first.join(30)
    assert left_ms > 7000, left_ms  # not renewed, it would have 5.5 s left
    assert redis_client.get(REAP_LOCK) is None  # let go when the pass ended
