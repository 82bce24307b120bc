"""What an instance costs, and how a run's cost reads in its last message and its status embed."""

from __future__ import annotations

from bot.render import separate_message, status_embed
from providers.runpod.section import RunPodSection
from state.cost import instance_cost
from state.models import Instance, InstanceState, Run
from state.payloads import Event, EventType
from state.stages import RunState
from tests.factories import job_spec


def test_instance_cost_counts_time_up() -> None:
    running = Instance(name="a", provider="runpod", run_id="r", price_per_hour=2.0, created_at=0.0)
    assert instance_cost(running, now=1800.0) == 1.0
    ended = running.model_copy(update={"state": InstanceState.TERMINATED, "updated_at": 3600.0})
    assert instance_cost(ended, now=99999.0) == 2.0  # an ended instance stops counting when it ended
    assert instance_cost(running.model_copy(update={"price_per_hour": None}), now=1800.0) == 0.0
    assert instance_cost(running, now=1800.0, since=900.0) == 0.5  # only the part after `since`
    assert instance_cost(ended, now=99999.0, since=4000.0) == 0.0


def test_the_last_message_and_the_status_say_the_cost() -> None:
    data = {"output_dir": "/o", "metrics": {"eval_loss_first": 2.0, "eval_loss": 1.0}, "cost_usd": 0.4567}
    done = separate_message(Event(id="r-9", type=EventType.RUN_SUCCEEDED, run_id="r", data=data))
    assert done is not None and done.endswith("\ncost: $0.46")
    failed = Event(
        id="r-9", type=EventType.RUN_FAILED, run_id="r", data={"reason": "TRAINING_FAILED", "cost_usd": 1.5}
    )
    assert (separate_message(failed) or "").endswith("\ncost: $1.50")
    local = separate_message(
        Event(id="r-9", type=EventType.RUN_SUCCEEDED, run_id="r", data={"output_dir": "/o", "cost_usd": 0.0})
    )
    assert "cost" not in (local or "x")  # a run that rented nothing says nothing about cost

    run = Run(
        run_id="r",
        state=RunState.TRAINING,
        provider="runpod",
        source="j",
        spec=job_spec(RunPodSection()),
        run_dir="/",
        output_dir="/o",
    )
    fields = {f["name"]: f["value"] for f in status_embed(run, None, cost_usd=12.345)["fields"]}
    assert fields["Cost"] == "$12.35"
    assert "Cost" not in {f["name"] for f in status_embed(run, None, cost_usd=0.0)["fields"]}
