"""The Discord messages about a run's node that someone may have to act on, or pay for."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from bot.render import SEPARATE, separate_message
from state.payloads import PAYLOADS, Event, EventType, InstanceLost

NODE_EVENTS = (
    EventType.RUN_PREEMPTED,
    EventType.INSTANCE_IDLE,
    EventType.INSTANCE_REMINDER,
    EventType.INSTANCE_STUCK,
    EventType.INSTANCE_LOST,
)


def message(kind: EventType, **data: Any) -> str:
    text = separate_message(Event(id="r-1", type=kind, run_id="r", data=data))
    assert text is not None
    return text


def test_every_node_event_gets_a_message_of_its_own() -> None:
    assert set(NODE_EVENTS) <= SEPARATE
    least = {  # each event's required fields only: the optional ones may be missing
        EventType.RUN_PREEMPTED: {
            "why": "gone", "preemption": 1, "max_preemptions": 5, "next_instance": "tf-r-2", "retry_in_s": 10,
        },
        EventType.INSTANCE_IDLE: {"idle_since": 0, "terminate_at": 60},
        EventType.INSTANCE_REMINDER: {"until": 120, "in_s": 60},
        EventType.INSTANCE_STUCK: {"since": 0, "attempts": 2},
        EventType.INSTANCE_LOST: {"looks": 3},
    }  # fmt: skip
    for kind in NODE_EVENTS:
        assert message(kind, instance="tf-r-1", **least[kind])


def test_an_event_whose_data_does_not_fit_its_type_is_refused() -> None:
    """Payloads are validated when an event is made: a missing, unknown or ill-typed key is an error."""
    with pytest.raises(ValidationError, match="looks"):
        Event(id="r-1", type=EventType.INSTANCE_LOST, data={"instance": "tf-r-1"})
    with pytest.raises(ValidationError, match="extra"):
        Event(id="r-1", type=EventType.INSTANCE_LOST, data={"instance": "tf-r-1", "looks": 3, "look": 3})
    with pytest.raises(ValidationError, match="cannot carry"):
        Event(id="r-1", type=EventType.INSTANCE_IDLE, data=InstanceLost(instance="tf-r-1", looks=3))
    assert set(PAYLOADS) == set(EventType)  # every event type has its payload model
    assert all(model.type == kind for kind, model in PAYLOADS.items())  # ... that files it under that type


def test_a_preemption_says_what_was_lost_where_and_what_comes_next() -> None:
    text = message(
        EventType.RUN_PREEMPTED, instance="tf-r-1", why="pod exited (stopped or preempted)", at_step=40,
        next_instance="tf-r-2", retry_in_s=10, preemption=1, max_preemptions=5,
    )  # fmt: skip
    assert "tf-r-1" in text and "stopped or preempted" in text and "step 40" in text
    assert "tf-r-2 in 10 s" in text and "1 of at most 5" in text


def test_a_stuck_node_alert_names_its_provider_id_and_price() -> None:
    text = message(
        EventType.INSTANCE_STUCK, instance="tf-r-1", provider_id="pod123", attempts=4, since=0,
        price_per_hour=2.5,
    )  # fmt: skip
    assert "pod123" in text and "4 terminate calls" in text and "$2.50/h" in text and "by hand" in text


def test_idle_and_reminder_say_when_the_node_ends() -> None:
    idle = message(EventType.INSTANCE_IDLE, instance="tf-r-1", idle_since=0, terminate_at=60)
    assert "1970-01-01 00:01 UTC" in idle
    assert "1970-01-01 00:02 UTC" in message(
        EventType.INSTANCE_REMINDER, instance="tf-r-1", until=120, in_s=60
    )


def test_a_trainer_without_its_wandb_run_is_told_in_a_message_of_its_own() -> None:
    assert EventType.WANDB_UNAVAILABLE in SEPARATE
    text = message(EventType.WANDB_UNAVAILABLE, status="unavailable", error="CommError: " + "x" * 600)
    assert text.startswith("📉 W&B could not be opened for run r (CommError: xxx") and "trains on" in text
    assert len(text) < 400  # the error cut, not the message
