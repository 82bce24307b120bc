"""Events: their types, one payload model per type (validated when the event is written), and the Event.

base.py holds EventType and the payload bases; runs.py, node.py and sweeps.py the payloads; PAYLOADS here
names the payload model of every event type, found from the classes themselves (each names its `type`; a
unit test checks that every type has one).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_serializer, model_validator

from state.payloads.base import TERMINAL_EVENTS, EventType, Metrics, NodeRecord, Payload
from state.payloads.node import (
    FinalizePulled,
    NodeCheck,
    NodeReady,
    NodeSetup,
    PrepareEntry,
    PrepareFetched,
    RaySubmitted,
    TrainBatchSize,
    TrainCheckpoint,
    TrainEval,
    TrainFinished,
    TrainPending,
    TrainRestarted,
    TrainResumed,
    TrainRollback,
    TrainStarted,
    TrainStep,
    TrainStopped,
    TrainSubmitted,
    WandbUnavailable,
)
from state.payloads.runs import (
    DiscordOrigin,
    GitOrigin,
    HubPush,
    InstanceAdopted,
    InstanceIdle,
    InstanceKept,
    InstanceLost,
    InstanceReady,
    InstanceReminder,
    InstanceRequested,
    InstanceStuck,
    InstanceTerminated,
    InstanceTerminating,
    InstanceWaiting,
    NodeJoined,
    NodeUnreachable,
    OfferChosen,
    OfferLeft,
    Origin,
    ReapTerminated,
    RunCancelled,
    RunCancelRequested,
    RunFailed,
    RunKicked,
    RunPreempted,
    RunQueued,
    RunReleased,
    RunRetrying,
    RunSucceeded,
    StageFinished,
    StageStarted,
    VolumeReady,
    WandbRun,
    submitter_of,
)
from state.payloads.sweeps import (
    BotAudit,
    BotCommand,
    BotRefused,
    SweepFinished,
    SweepRow,
    SweepStarted,
    SweepSummary,
)


def _by_type() -> dict[EventType, type[Payload]]:
    """Every payload class that names its event type (`type` in its own body), under that type: an event
    type is registered by the one class that declares it; a second is an error at import."""
    found: dict[EventType, type[Payload]] = {}
    classes: list[type[Payload]] = [Payload]
    while classes:
        model = classes.pop()
        classes.extend(model.__subclasses__())
        if "type" in vars(model) and found.setdefault(model.type, model) is not model:
            raise TypeError(f"{model.type.value}: both {found[model.type].__name__} and {model.__name__}")
    return found


PAYLOADS: Mapping[EventType, type[Payload]] = MappingProxyType(_by_type())
"""The payload model of each event type."""


class Event(BaseModel):
    """One thing that happened. `id` is unique and stable, so consumers can drop repeats."""

    model_config = ConfigDict(extra="forbid")

    id: str
    type: EventType
    run_id: str | None = None
    time: float = Field(default_factory=time.time)
    data: Payload

    @model_validator(mode="before")
    @classmethod
    def _typed_data(cls, value: Any) -> Any:
        """Data given (or read back) as a mapping becomes its type's payload model, checked."""
        if isinstance(value, dict) and not isinstance(value.get("data"), Payload):
            model = PAYLOADS[EventType(value["type"])]
            return {**value, "data": model.model_validate(value.get("data") or {})}
        return value

    @model_validator(mode="after")
    def _data_of_its_type(self) -> Event:
        if self.data.type != self.type:
            raise ValueError(f"a {self.type.value} event cannot carry a {type(self.data).__name__}")
        return self

    @field_serializer("data")
    def _data_as_given(self, data: Payload) -> dict[str, Any]:
        return data.wire()


__all__ = [
    "PAYLOADS",
    "TERMINAL_EVENTS",
    "BotAudit",
    "BotCommand",
    "BotRefused",
    "DiscordOrigin",
    "Event",
    "EventType",
    "FinalizePulled",
    "GitOrigin",
    "HubPush",
    "InstanceAdopted",
    "InstanceIdle",
    "InstanceKept",
    "InstanceLost",
    "InstanceReady",
    "InstanceReminder",
    "InstanceRequested",
    "InstanceStuck",
    "InstanceTerminated",
    "InstanceTerminating",
    "InstanceWaiting",
    "Metrics",
    "NodeCheck",
    "NodeJoined",
    "NodeReady",
    "NodeRecord",
    "NodeSetup",
    "NodeUnreachable",
    "OfferChosen",
    "OfferLeft",
    "Origin",
    "Payload",
    "PrepareEntry",
    "PrepareFetched",
    "RaySubmitted",
    "ReapTerminated",
    "RunCancelRequested",
    "RunCancelled",
    "RunFailed",
    "RunKicked",
    "RunPreempted",
    "RunQueued",
    "RunReleased",
    "RunRetrying",
    "RunSucceeded",
    "StageFinished",
    "StageStarted",
    "SweepFinished",
    "SweepRow",
    "SweepStarted",
    "SweepSummary",
    "TrainBatchSize",
    "TrainCheckpoint",
    "TrainEval",
    "TrainFinished",
    "TrainPending",
    "TrainRestarted",
    "TrainResumed",
    "TrainRollback",
    "TrainStarted",
    "TrainStep",
    "TrainStopped",
    "TrainSubmitted",
    "VolumeReady",
    "WandbRun",
    "WandbUnavailable",
    "submitter_of",
]
