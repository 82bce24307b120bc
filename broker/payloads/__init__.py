"""Events: their types, one payload model per type (validated when the event is written), and the Event.

base.py holds EventType and the payload bases; runs.py, node.py and sweeps.py the payloads; PAYLOADS here
names the payload model of every event type, explicitly (a unit test checks that it covers them all).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_serializer, model_validator

from broker.payloads.base import (
    TERMINAL_EVENTS,
    EventType,
    Metrics,
    NodeRecord,
    Payload,
)
from broker.payloads.node import (
    DownloadSummary,
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
    TrainSubmitted,
    WandbUnavailable,
)
from broker.payloads.runs import (
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
    WandbRun,
    submitter_of,
)
from broker.payloads.sweeps import (
    BotAudit,
    BotCommand,
    BotRefused,
    SweepFinished,
    SweepRow,
    SweepStarted,
    SweepSummary,
)

PAYLOADS: Mapping[EventType, type[Payload]] = MappingProxyType(
    {
        EventType.RUN_QUEUED: RunQueued,
        EventType.WANDB_RUN: WandbRun,
        EventType.STAGE_STARTED: StageStarted,
        EventType.STAGE_FINISHED: StageFinished,
        EventType.OFFER_CHOSEN: OfferChosen,
        EventType.OFFER_LEFT: OfferLeft,
        EventType.INSTANCE_REQUESTED: InstanceRequested,
        EventType.INSTANCE_ADOPTED: InstanceAdopted,
        EventType.INSTANCE_READY: InstanceReady,
        EventType.INSTANCE_TERMINATING: InstanceTerminating,
        EventType.INSTANCE_TERMINATED: InstanceTerminated,
        EventType.INSTANCE_KEPT: InstanceKept,
        EventType.INSTANCE_IDLE: InstanceIdle,
        EventType.INSTANCE_REMINDER: InstanceReminder,
        EventType.INSTANCE_STUCK: InstanceStuck,
        EventType.INSTANCE_LOST: InstanceLost,
        EventType.NODE_UNREACHABLE: NodeUnreachable,
        EventType.NODE_JOINED: NodeJoined,
        EventType.NODE_SETUP: NodeSetup,
        EventType.NODE_READY: NodeReady,
        EventType.PREPARE_SUBMITTED: RaySubmitted,
        EventType.PREPARE_ENTRY: PrepareEntry,
        EventType.PREPARE_FETCHED: PrepareFetched,
        EventType.TRAIN_SUBMITTED: TrainSubmitted,
        EventType.TRAIN_STARTED: TrainStarted,
        EventType.TRAIN_STEP: TrainStep,
        EventType.TRAIN_EVAL: TrainEval,
        EventType.TRAIN_CHECKPOINT: TrainCheckpoint,
        EventType.TRAIN_FINISHED: TrainFinished,
        EventType.TRAIN_RESUMED: TrainResumed,
        EventType.TRAIN_ROLLBACK: TrainRollback,
        EventType.TRAIN_BATCH_SIZE: TrainBatchSize,
        EventType.WANDB_UNAVAILABLE: WandbUnavailable,
        EventType.TRAIN_PENDING: TrainPending,
        EventType.TRAIN_RESTARTED: TrainRestarted,
        EventType.FINALIZE_PUSHED: HubPush,
        EventType.FINALIZE_PULLED: FinalizePulled,
        EventType.RUN_CANCEL_REQUESTED: RunCancelRequested,
        EventType.RUN_SUCCEEDED: RunSucceeded,
        EventType.RUN_FAILED: RunFailed,
        EventType.RUN_CANCELLED: RunCancelled,
        EventType.RUN_KICKED: RunKicked,
        EventType.RUN_RETRYING: RunRetrying,
        EventType.RUN_PREEMPTED: RunPreempted,
        EventType.RUN_RELEASED: RunReleased,
        EventType.SWEEP_STARTED: SweepStarted,
        EventType.SWEEP_FINISHED: SweepFinished,
        EventType.REAP_TERMINATED: ReapTerminated,
        EventType.BOT_REFUSED: BotRefused,
        EventType.BOT_COMMAND: BotCommand,
    }
)
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
    "DownloadSummary",
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
    "TrainSubmitted",
    "WandbRun",
    "WandbUnavailable",
    "submitter_of",
]
