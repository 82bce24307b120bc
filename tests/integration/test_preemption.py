"""A node lost under a run (preempted, outbid, gone from the list) is replaced, not counted as the run's
failure: the stage task that finds it (workers.runner.run_stage) against a real Redis and the fake RunPod
through the real runpod client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery.exceptions import Retry

from core.errors import FailureReason, NodeError
from providers.base import LaunchRequest
from providers.registry import FleetSettings
from providers.runpod.section import RunPodSection
from state.events import read_run
from state.models import Instance, InstanceState, Run
from state.payloads import OfferLeft, RunPreempted
from state.stages import RunState, Stage
from tests.factories import ledger_run
from tests.fakes.runpod import FakeRunPod
from workers import context
from workers.runner import run_stage
from workers.stage import Next

pytestmark = pytest.mark.integration
SECTION = RunPodSection(gpu="NVIDIA RTX A5000", pod_type="INTERRUPTABLE", max_preemptions=5)


@pytest.fixture
def fake(fleet_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRunPod]:
    with FakeRunPod(api_key="rp-key", home=fleet_home / "fake", nodes="none", ready_delay_s=0) as fake:
        fake.stop_notice_s = 0.0  # no trainer to tell (no nodes): a preempted pod is shown EXITED at once
        monkeypatch.setenv("RUNPOD_API_KEY", "rp-key")
        yield fake


@pytest.fixture
def ctx(
    redis_client: redis.Redis[str], redis_url: str, fleet_home: Path, fake: FakeRunPod
) -> context.Context:
    from broker.app import configure

    settings = FleetSettings(
        home=fleet_home,
        **fake.proxy.values(),
        runpod_api_base_url=fake.url,
        max_preemptions=2,
        preempt_backoff_s=5,
    )
    configure(settings, redis_url)
    return context.init(settings, redis_url)


def task(task_id: str = "t1", retries: int = 0) -> Any:
    """The part of a bound Celery task that run_stage reads; `retry` gives Celery's Retry, to raise."""

    def retry(exc: Exception, countdown: float) -> Retry:
        return Retry(exc=exc, when=countdown)

    return SimpleNamespace(request=SimpleNamespace(id=task_id, retries=retries), max_retries=12, retry=retry)


def training_run(ctx: context.Context, section: RunPodSection = SECTION, **fields: Any) -> str:
    """Run r1 TRAINING on its live pod tf-r1-<attempt>; returns the pod's id at the fake."""
    run = ledger_run(
        "r1",
        section,
        RunState.TRAINING,
        progress={"step": 40, "finished": False},
        ray_jobs={"train": "r1-1-train"},
        **fields,
    )
    run.instance = run.instance_name
    ctx.ledger.create_run(run, [])
    pod = ctx.provider("runpod").launch(LaunchRequest(run.instance, "r1", run.node_section(0)))
    ctx.ledger.put_instance(
        Instance(name=run.instance, provider="runpod", run_id="r1", state=InstanceState.RUNNING)
    )
    ctx.dispatcher.claim("r1", "t1")
    return pod.provider_id


def head_gone(_ctx: context.Context, _run: Run) -> Next:
    raise NodeError("cannot read job r1-1-train: Connection refused")


def test_a_preempted_node_is_replaced_and_the_run_goes_on_on_a_new_one(
    ctx: context.Context, fake: FakeRunPod
) -> None:
    pod = training_run(ctx)
    assert fake.preempt(pod)

    run_stage(task(), "r1", Stage.TRAIN, head_gone)  # no exception: not a failure to retry

    run = ctx.ledger.get_run("r1")
    assert run.state == RunState.PROVISIONING and run.attempt == 2 and run.preemptions == 1
    assert run.instance is None and run.ray_jobs == {} and run.progress.step == 40
    assert run.instance_name == "tf-r1-2"
    (preempted,) = [e.data for _, e in read_run(ctx.redis, "r1") if isinstance(e.data, RunPreempted)]
    assert preempted.instance == "tf-r1-1" and preempted.at_step == 40
    assert preempted.next_instance == "tf-r1-2" and preempted.retry_in_s == 5
    assert "stopped or preempted" in preempted.why
    # The lost pod is ended (a stopped pod still bills its disk); the provision task is on its way.
    assert fake.state()["instances"] == []
    old = ctx.ledger.get_instance("tf-r1-1")
    assert old is not None and old.state == InstanceState.TERMINATED
    assert ctx.redis.llen(Stage.PROVISION.value) == 1
    assert ctx.dispatcher.owner("r1") not in (None, "t1")


def test_a_node_that_answers_again_is_not_replaced(ctx: context.Context, fake: FakeRunPod) -> None:
    training_run(ctx)
    with pytest.raises(Retry) as retried:  # retried as usual: the pod is up, its head was only slow
        run_stage(task(), "r1", Stage.TRAIN, head_gone)
    assert isinstance(retried.value.exc, NodeError)
    run = ctx.ledger.get_run("r1")
    assert run.attempt == 1 and run.state == RunState.TRAINING


def test_a_node_missing_from_the_list_is_replaced_only_after_several_looks(
    ctx: context.Context, fake: FakeRunPod
) -> None:
    pod = training_run(ctx)
    with fake.lock:
        fake.instances.pop(pod)
    for retries in range(2):  # lists lag: the first looks retry as usual
        with pytest.raises(Retry):
            run_stage(task(retries=retries), "r1", Stage.TRAIN, head_gone)
    run_stage(task(retries=2), "r1", Stage.TRAIN, head_gone)
    assert ctx.ledger.get_run("r1").attempt == 2


def test_preemptions_beyond_the_limit_fail_the_run_and_end_the_node(
    ctx: context.Context, fake: FakeRunPod
) -> None:
    pod = training_run(ctx, attempt=3, preemptions=2)  # max_preemptions=2 already used
    assert fake.preempt(pod)
    run_stage(task(), "r1", Stage.TRAIN, head_gone)
    run = ctx.ledger.get_run("r1")
    assert run.state == RunState.FAILED and run.failure_reason == FailureReason.INSTANCE_LOST
    assert "2 lost nodes replaced already" in str(run.failure_message)
    assert fake.state()["instances"] == []


def test_an_interruptible_run_replaces_only_max_preemptions_spot_machines(
    ctx: context.Context, fake: FakeRunPod
) -> None:
    section = SECTION.model_copy(update={"max_preemptions": 1})
    pod = training_run(ctx, section, attempt=2, preemptions=1)  # the job's one replacement is spent
    assert fake.preempt(pod)
    run_stage(task(), "r1", Stage.TRAIN, head_gone)
    run = ctx.ledger.get_run("r1")
    assert run.state == RunState.FAILED and run.failure_reason == FailureReason.INSTANCE_LOST
    assert "1 spot machines replaced already (max_preemptions: 1)" in str(run.failure_message)
    assert fake.state()["instances"] == []


def test_an_auto_run_preempted_past_max_preemptions_goes_on_on_demand(
    ctx: context.Context, fake: FakeRunPod
) -> None:
    section = RunPodSection(gpu="NVIDIA RTX A5000", pod_type="auto", max_preemptions=1)
    pod = training_run(ctx, section, attempt=2, preemptions=1)
    assert fake.state()["instances"][0]["bid"] is not None  # auto rents spot first
    assert fake.preempt(pod)
    run_stage(task(), "r1", Stage.TRAIN, head_gone)

    run = ctx.ledger.get_run("r1")
    assert run.state == RunState.PROVISIONING and run.attempt == 3 and run.preemptions == 2
    assert (
        run.spot_left is not None and "2 spot machines lost, more than max_preemptions (1)" in run.spot_left
    )
    section_now = run.node_section(0)
    assert isinstance(section_now, RunPodSection) and section_now.pod_type == "ON_DEMAND"
    (left,) = [e.data for _, e in read_run(ctx.redis, "r1") if isinstance(e.data, OfferLeft)]
    assert (left.offer, left.instance, left.why) == ("spot", "tf-r1-2", run.spot_left)
    # The replacement is rented on demand: the fake's pod for attempt 3 is not interruptible.
    ctx.provider("runpod").launch(LaunchRequest(run.instance_name, "r1", section_now))
    (made,) = fake.state()["instances"]
    assert made["name"] == "tf-r1-3" and made["bid"] is None


def test_an_auto_run_with_no_spot_machine_rents_the_same_node_on_demand(
    ctx: context.Context, fake: FakeRunPod
) -> None:
    """`pod_type: auto` asks for spot first; RunPod has no spot A5000 (its spot pool is empty, its on-demand
    one is not): the run says why it left spot (offer.left) and rents the same node, tf-r1-1, on demand."""
    from workers.stages import provision

    fake.set_spot_stock("NVIDIA RTX A5000", 0)
    section = RunPodSection(gpu="NVIDIA RTX A5000", pod_type="auto", max_bid_per_gpu=0.5)
    ctx.ledger.create_run(ledger_run("r1", section), [])
    provision.step(ctx, ctx.ledger.get_run("r1"))  # the spot create finds no machine
    run = ctx.ledger.get_run("r1")
    assert run.spot_left is not None and run.spot_left.startswith("no spot machine: ")
    assert fake.state()["instances"] == [] and fake.state()["requests"]["create"] == 1
    provision.step(ctx, run)
    (pod,) = fake.state()["instances"]
    assert (pod["name"], pod["bid"], pod["price_per_hour"]) == ("tf-r1-1", None, 0.27)  # on demand, secure
    (left,) = [e.data for _, e in read_run(ctx.redis, "r1") if isinstance(e.data, OfferLeft)]
    assert (left.offer, left.instance, left.why) == ("spot", "tf-r1-1", run.spot_left)
    assert left.why.endswith("going on on demand (pod_type: auto)")
