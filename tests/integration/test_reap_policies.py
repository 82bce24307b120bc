"""The reaper's policies against a real Redis and the fake RunPod (through the real runpod client): idle
nodes, terminate_after, kept nodes' reminders, terminates that do not take, nodes that stop being listed,
nodes of other people. Time is moved by editing the ledger's clocks, never by mocking."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from providers.base import LaunchRequest
from providers.registry import FleetSettings
from providers.runpod.section import RunPodSection
from state.events import read_run
from state.models import Instance, InstanceState
from state.payloads import InstanceIdle, InstanceReminder
from state.stages import RunState
from tests.factories import ledger_run
from tests.fakes.base import Instance as FakeInstance
from tests.fakes.runpod import FakeRunPod
from workers import context
from workers.stages.reap import Report, reap_once

pytestmark = pytest.mark.integration
GPU = "NVIDIA RTX A5000"


@pytest.fixture
def fake(fleet_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRunPod]:
    with FakeRunPod(api_key="rp-key", home=fleet_home / "fake", nodes="none", ready_delay_s=0) as fake:
        monkeypatch.setenv("RUNPOD_API_KEY", "rp-key")
        yield fake


def make_ctx(redis_url: str, fleet_home: Path, fake: FakeRunPod, **settings: Any) -> context.Context:
    from broker.app import configure

    values: dict[str, Any] = {"orphan_grace_s": 0, "stall_after_s": 30, "reap_interval_s": 30}
    values.update(settings)
    config = FleetSettings(home=fleet_home, runpod_api_base_url=fake.url, **fake.proxy.values(), **values)
    configure(config, redis_url)
    return context.init(config, redis_url)


@pytest.fixture
def ctx(
    redis_client: redis.Redis[str], redis_url: str, fleet_home: Path, fake: FakeRunPod
) -> context.Context:
    return make_ctx(redis_url, fleet_home, fake)


def section(**keys: Any) -> RunPodSection:
    return RunPodSection(gpu=GPU, **keys)


def start(ctx: context.Context, run_id: str, state: RunState, node: RunPodSection, **record: Any) -> str:
    """A run in `state` on a live pod tf-<run>-1 (launched at the fake), both in the ledger."""
    name = f"tf-{run_id}-1"
    ctx.ledger.create_run(ledger_run(run_id, node, state, instance=name), [])
    inst = ctx.provider("runpod").launch(LaunchRequest(name, run_id, node))
    values: dict[str, Any] = {"state": InstanceState.RUNNING, "provider_id": inst.provider_id}
    values.update(record)
    ctx.ledger.put_instance(Instance(name=name, provider="runpod", run_id=run_id, **values))
    return name


def reap(ctx: context.Context) -> Report:
    report = reap_once(ctx)
    assert report is not None
    return report


def listed(fake: FakeRunPod) -> list[str]:
    return [str(i["name"]) for i in fake.state()["instances"]]


def kinds(ctx: context.Context, run_id: str) -> list[str]:
    return [e.type.value for _, e in read_run(ctx.redis, run_id)]


def record(ctx: context.Context, name: str) -> Instance:
    found = ctx.ledger.get_instance(name)
    assert found is not None
    return found


def test_an_idle_node_is_announced_then_terminated_after_stop_after(
    ctx: context.Context, fake: FakeRunPod
) -> None:
    # one_shot: false keeps the node after a success; stop_after says how long it may idle.
    name = start(ctx, "idle", RunState.SUCCEEDED, section(one_shot=False, stop_after=60))
    ended = ctx.ledger.get_run("idle").updated_at

    first = reap(ctx)
    assert first.idle == [name] and first.terminated == []
    (announced,) = [e for _, e in read_run(ctx.redis, "idle") if e.type.value == "instance.idle"]
    assert isinstance(announced.data, InstanceIdle)
    assert announced.data.terminate_at == pytest.approx(ended + 60)
    assert reap(ctx).idle == []  # announced once
    assert listed(fake) == [name]

    ctx.ledger.update_instance(name, idle_since=time.time() - 61)  # a minute later
    second = reap(ctx)
    assert second.terminated == [name]
    assert record(ctx, name).why_terminated.startswith("idle for 6")  # type: ignore[union-attr]
    assert listed(fake) == []
    assert reap(ctx).confirmed == [name]
    assert record(ctx, name).state == InstanceState.TERMINATED
    assert kinds(ctx, "idle") == ["instance.idle", "reap.terminated", "instance.terminated"]


def test_the_idle_announcement_sends_a_reaper_pass_for_the_deadline(
    ctx: context.Context, fake: FakeRunPod
) -> None:
    # Not the next periodic pass (up to reap_interval_s late): a pass queued for stop_after's end.
    name = start(ctx, "due", RunState.SUCCEEDED, section(one_shot=False, stop_after=60))
    ended = ctx.ledger.get_run("due").updated_at
    assert reap(ctx).idle == [name]
    queued = [json.loads(m) for m in ctx.redis.lrange("reap", 0, -1)]
    (task,) = [m["headers"] for m in queued if m["headers"]["task"] == "trainfleet.reap_at"]
    eta = datetime.fromisoformat(task["eta"]).timestamp()
    assert eta == pytest.approx(ended + 60 + 0.5, abs=1.0)
    reap(ctx)  # announced once: no second one
    assert (
        sum(json.loads(m)["headers"]["task"] == "trainfleet.reap_at" for m in ctx.redis.lrange("reap", 0, -1))
        == 1
    )


def test_a_busy_gpu_is_not_idle_and_stop_after_minus_one_never_idles(
    ctx: context.Context, fake: FakeRunPod
) -> None:
    name = start(ctx, "busy", RunState.SUCCEEDED, section(one_shot=False, stop_after=60))
    (pod,) = fake.instances.values()
    pod.gpu_util = 85.0  # somebody uses the node they kept
    ctx.ledger.update_instance(name, idle_since=time.time() - 3600)
    assert reap(ctx).terminated == []
    assert record(ctx, name).idle_since is None  # busy: the idle clock starts again
    pod.gpu_util = 0.0
    assert reap(ctx).idle == [name]

    forever = start(ctx, "forever", RunState.SUCCEEDED, section(one_shot=False, stop_after=-1))
    ctx.ledger.update_run("forever", lambda r: None)
    assert reap(ctx).idle == []
    assert forever in listed(fake)


def test_terminate_after_is_a_hard_deadline_even_for_a_training_run(
    ctx: context.Context, fake: FakeRunPod
) -> None:
    name = start(ctx, "long", RunState.TRAINING, section(terminate_after=60))
    assert reap(ctx).terminated == []  # in use, and young
    ctx.ledger.update_instance(name, created_at=time.time() - 61)

    report = reap(ctx)

    assert report.failed == ["long"]
    run = ctx.ledger.get_run("long")
    assert run.state == RunState.FAILED and run.failure_reason is not None
    assert run.failure_reason.value == "DEADLINE" and "terminate_after (60 s)" in str(run.failure_message)
    assert listed(fake) == []
    assert "run.failed" in kinds(ctx, "long")


def test_a_kept_node_gets_one_reminder_before_its_deadline_then_ends(
    ctx: context.Context, fake: FakeRunPod
) -> None:
    until = time.time() + 300
    name = start(ctx, "kept", RunState.FAILED, section(one_shot=False), keep_until=until)
    assert reap(ctx).reminded == [name]  # 5 minutes left, within kept_reminder_s (15 min)
    assert reap(ctx).reminded == []
    (reminder,) = [e for _, e in read_run(ctx.redis, "kept") if e.type.value == "instance.reminder"]
    assert isinstance(reminder.data, InstanceReminder)
    assert reminder.data.until == until and 290 < reminder.data.in_s <= 300
    assert listed(fake) == [name]
    ctx.ledger.update_instance(name, keep_until=time.time() - 1)
    assert reap(ctx).terminated == [name]
    assert listed(fake) == []


def test_a_terminate_is_retried_with_back_off_and_alerts_every_cycle_until_the_node_is_gone(
    redis_client: redis.Redis[str], redis_url: str, fleet_home: Path, fake: FakeRunPod
) -> None:
    ctx = make_ctx(
        redis_url, fleet_home, fake, reap_interval_s=1, terminate_retry_max_s=0.4, stuck_alert_after_s=0
    )
    name = start(ctx, "stubborn", RunState.SUCCEEDED, section())  # one_shot: its node should be gone
    # Two terminates fail outright, the third is "OK" but the pod stays listed for two more looks.
    fake.add_faults(
        [
            {"op": "terminate", "kind": "500", "times": 2},
            {"op": "terminate", "kind": "terminate_ok_but_listed", "times": 2},
        ]
    )
    assert reap(ctx).terminated == [name]  # the first call: a 500
    again = reap(ctx)
    assert again.retried == [] and again.stuck == [name]  # too soon to call again; but alert
    calls, alerts, passes = 1, 1, 0
    while name in listed(fake) or record(ctx, name).state != InstanceState.TERMINATED:
        passes += 1
        assert passes < 20, record(ctx, name)
        time.sleep(0.45)  # longer than the longest back-off
        report = reap(ctx)
        calls += len(report.retried)
        alerts += len(report.stuck)
    assert record(ctx, name).terminate_attempts == calls >= 3  # two 500s, then the one that took
    assert fake.state()["requests"]["terminate"] >= 3
    events = kinds(ctx, "stubborn")
    assert events.count("reap.terminated") == 1 and events.count("instance.stuck") == alerts >= 3
    assert events[-1] == "instance.terminated"


def test_an_unlisted_node_is_lost_only_after_several_looks_in_a_row(
    ctx: context.Context, fake: FakeRunPod
) -> None:
    name = start(ctx, "blink", RunState.TRAINING, section())
    pod_id = record(ctx, name).provider_id
    with fake.lock:
        hidden = fake.instances.pop(str(pod_id))  # the list lags: the pod is not shown for a while
    assert reap(ctx).lost == [] and record(ctx, name).missed == 1
    assert reap(ctx).lost == [] and record(ctx, name).missed == 2
    with fake.lock:
        fake.instances[hidden.id] = hidden  # shown again: the count starts over
    assert reap(ctx).lost == [] and record(ctx, name).missed == 0
    with fake.lock:
        fake.instances.pop(hidden.id)
    for _ in range(2):
        assert reap(ctx).lost == []
    assert reap(ctx).lost == [name]
    assert record(ctx, name).state == InstanceState.LOST
    assert kinds(ctx, "blink").count("instance.lost") == 1
    assert fake.state()["requests"].get("create") == 1  # never created again for not being seen


def test_nodes_of_other_people_are_never_touched_and_a_left_node_is_ended(
    ctx: context.Context, fake: FakeRunPod
) -> None:
    theirs = FakeInstance(
        id="theirs", name="jupyter-notebook", gpu=GPU, gpu_count=1, price_per_hour=0.4, bid=None, env={}
    )
    fake.add_instance(theirs)
    # A run on its second node (the first was lost): its first node, listed again, is ended.
    left = start(ctx, "moved", RunState.TRAINING, section())
    ctx.ledger.update_run("moved", lambda r: setattr(r, "attempt", 2) or setattr(r, "instance", "tf-moved-2"))

    report = reap(ctx)

    assert report.terminated == [left]
    assert record(ctx, left).why_terminated == "replaced"
    assert listed(fake) == ["jupyter-notebook"]
    assert fake.state()["requests"]["terminate"] == 1


def test_a_clusters_pods_are_reaped_together_and_a_left_attempts_pods_all_go(
    ctx: context.Context, fake: FakeRunPod
) -> None:
    """A run on two pods, now on its second cluster (the first lost a node): the first attempt's pods are
    replaced, both; the second's are in use until the run ends, then end together (the finalize that should
    have ended them crashed)."""
    fake.add_network_volume("vol-grp")
    node = section(num_nodes=2, network_volume_id="vol-grp")
    run = ledger_run("grp", node, RunState.TRAINING, attempt=2, instance="tf-grp-2-0")
    ctx.ledger.create_run(run, [])
    provider = ctx.provider("runpod")
    for attempt in (1, 2):
        head, worker = run.instance_names_of(attempt)
        for name, joins in ((head, None), (worker, head)):
            inst = provider.launch(LaunchRequest(name, "grp", node, head=joins))
            ctx.ledger.put_instance(
                Instance(
                    name=name,
                    provider="runpod",
                    run_id="grp",
                    head=joins,
                    state=InstanceState.RUNNING,
                    provider_id=inst.provider_id,
                )
            )
    assert sorted(listed(fake)) == ["tf-grp-1-0", "tf-grp-1-1", "tf-grp-2-0", "tf-grp-2-1"]

    assert sorted(reap(ctx).terminated) == ["tf-grp-1-0", "tf-grp-1-1"]  # the cluster the run left
    assert {record(ctx, n).why_terminated for n in ("tf-grp-1-0", "tf-grp-1-1")} == {"replaced"}
    assert sorted(listed(fake)) == ["tf-grp-2-0", "tf-grp-2-1"]  # in use: both kept

    ctx.ledger.update_run("grp", lambda r: setattr(r, "state", RunState.SUCCEEDED) or [])
    assert sorted(reap(ctx).terminated) == ["tf-grp-2-0", "tf-grp-2-1"]
    assert listed(fake) == []
    assert {record(ctx, n).why_terminated for n in ("tf-grp-2-0", "tf-grp-2-1")} == {"run ended"}
