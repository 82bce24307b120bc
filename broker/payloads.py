"""Events: their types, one payload model per type (validated when the event is written), and the Event.

A payload knows its event type (`Payload.type`), so a stage writes `StageStarted(stage=...)` and the
ledger files it under `stage.started`. On the wire an event's data is the payload's fields as they were
given (unset ones left out), so `fleet logs --json`, the notifier and W&B read the same JSON as ever.

The fleet's own payloads are strict: a key that is not declared is a bug in its writer. The trainer's
progress lines (`train.*`, `prepare.fetched`) come from the node, which may run a newer trainer than this
fleet: their declared fields are checked and typed, and what else they carry is kept as it came.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_serializer, model_validator

from broker.constants import Stage
from core.errors import FailureReason
from jobs.sections import ProviderName

Metrics = dict[str, JsonValue]
"""The trainer's result metrics (eval_loss_first, eval_loss, train_loss, global_step, ...)."""


class EventType(StrEnum):
    """What an event reports. Events carry these values and a typed payload, never prose alone."""

    RUN_QUEUED = "run.queued"
    WANDB_RUN = "wandb.run"
    STAGE_STARTED = "stage.started"
    STAGE_FINISHED = "stage.finished"
    INSTANCE_REQUESTED = "instance.requested"
    INSTANCE_ADOPTED = "instance.adopted"
    INSTANCE_READY = "instance.ready"
    INSTANCE_TERMINATING = "instance.terminating"
    INSTANCE_TERMINATED = "instance.terminated"
    INSTANCE_KEPT = "instance.kept"
    INSTANCE_IDLE = "instance.idle"  # no active run on it: terminated at `terminate_at` unless used again
    INSTANCE_REMINDER = "instance.reminder"  # a kept instance ends soon
    INSTANCE_STUCK = "instance.stuck"  # alert: asked to terminate, still listed (every reap cycle)
    INSTANCE_LOST = "instance.lost"  # the provider stopped listing it (several looks in a row)
    NODE_JOINED = "node.joined"  # a Ray node joined the run's cluster (its head's State API lists it ALIVE)
    PREPARE_SUBMITTED = "prepare.submitted"
    PREPARE_FETCHED = "prepare.fetched"
    TRAIN_SUBMITTED = "train.submitted"
    TRAIN_STARTED = "train.started"
    TRAIN_STEP = "train.step"
    TRAIN_EVAL = "train.eval"
    TRAIN_CHECKPOINT = "train.checkpoint"
    TRAIN_FINISHED = "train.finished"
    TRAIN_RESUMED = "train.resumed"
    TRAIN_ROLLBACK = "train.rollback"
    TRAIN_BATCH_SIZE = "train.batch_size"
    TRAIN_RESTARTED = "train.restarted"
    FINALIZE_PUSHED = "finalize.pushed"
    FINALIZE_PULLED = "finalize.pulled"
    RUN_CANCEL_REQUESTED = "run.cancel_requested"
    RUN_SUCCEEDED = "run.succeeded"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"
    RUN_KICKED = "run.kicked"
    RUN_PREEMPTED = "run.preempted"  # its node was lost (preempted): a new one is coming, training resumes
    RUN_RELEASED = "run.released"  # a sweep's waiting child got a slot: it goes to provision now
    SWEEP_STARTED = "sweep.started"
    SWEEP_FINISHED = "sweep.finished"  # every child ended: the table of parameters against the metric
    REAP_TERMINATED = "reap.terminated"
    BOT_REFUSED = "bot.refused"  # audit: an interaction the access check or a cap refused
    BOT_COMMAND = "bot.command"  # audit: a command that changed something (train, cancel, terminate)


TERMINAL_EVENTS = (EventType.RUN_SUCCEEDED, EventType.RUN_FAILED, EventType.RUN_CANCELLED)


class Payload(BaseModel):
    """What one type of event says. Subclasses set `type` and declare their fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: ClassVar[EventType]

    def wire(self) -> dict[str, Any]:
        """The payload as the event stream carries it: JSON values, only the fields that were given."""
        return self.model_dump(mode="json", exclude_unset=True)


class NodeRecord(Payload):
    """A payload relayed from one of the trainer's progress lines: undeclared keys are kept as they came."""

    model_config = ConfigDict(extra="allow", frozen=True)


class HubPush(Payload):
    """The run's results are on the HF Hub (what the node's `pushed` progress line said)."""

    type = EventType.FINALIZE_PUSHED
    repo_id: str
    commit: str | None = None
    url: str | None = None


class GitOrigin(BaseModel):
    """Where a run from the git trigger came from: the repository, branch, commit and config path."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = "git"
    repo: str
    branch: str | None = None
    commit: str
    path: str | None = None
    since: str | None = Field(None, description="`fleet enqueue --changed-since`: the base it compared to.")


# The run's life


class RunQueued(Payload):
    type = EventType.RUN_QUEUED
    source: str
    provider: ProviderName
    warnings: list[str] = Field(default_factory=list)
    sweep_id: str | None = None
    params: dict[str, JsonValue] | None = None
    held: bool | None = None
    origin: GitOrigin | None = None


class WandbRun(Payload):
    type = EventType.WANDB_RUN
    run_id: str
    project: str
    entity: str | None = None
    mode: str
    url: str | None = None


class StageStarted(Payload):
    type = EventType.STAGE_STARTED
    stage: Stage


class StageFinished(Payload):
    type = EventType.STAGE_FINISHED
    stage: Stage
    seconds: float | None = None


class RunCancelRequested(Payload):
    type = EventType.RUN_CANCEL_REQUESTED
    state: str


class RunSucceeded(Payload):
    type = EventType.RUN_SUCCEEDED
    output_dir: str
    metrics: Metrics = Field(default_factory=dict)
    hub: HubPush | None = None
    cost_usd: float | None = None


class RunFailed(Payload):
    type = EventType.RUN_FAILED
    reason: FailureReason | None = None
    message: str = ""
    cost_usd: float | None = None


class RunCancelled(RunFailed):
    type = EventType.RUN_CANCELLED


class RunKicked(Payload):
    """The reaper re-sent the stage task of a run whose task chain died."""

    type = EventType.RUN_KICKED
    stage: Stage


class RunPreempted(Payload):
    type = EventType.RUN_PREEMPTED
    instance: str | None = None
    why: str
    preemption: int
    max_preemptions: int
    at_step: int | None = None
    next_instance: str
    retry_in_s: float


class RunReleased(Payload):
    type = EventType.RUN_RELEASED
    sweep_id: str | None = None


# Instances and nodes


class InstanceRequested(Payload):
    type = EventType.INSTANCE_REQUESTED
    instance: str
    provider: ProviderName
    price_per_hour: float | None = None
    node: int | None = Field(None, description="A cluster's node: its index (0: the head).")
    num_nodes: int | None = None


class InstanceAdopted(Payload):
    type = EventType.INSTANCE_ADOPTED
    instance: str
    provider: ProviderName


class InstanceReady(Payload):
    type = EventType.INSTANCE_READY
    instance: str
    dashboard_url: str | None = None
    instances: list[str] | None = None
    num_nodes: int | None = None


class InstanceTerminating(Payload):
    type = EventType.INSTANCE_TERMINATING
    instance: str
    by: str | None = Field(None, description="'user': `fleet terminate` or /terminate.")


class InstanceTerminated(InstanceTerminating):
    type = EventType.INSTANCE_TERMINATED


class InstanceKept(Payload):
    type = EventType.INSTANCE_KEPT
    instance: str | None = None
    why: str
    until: float
    instances: list[str] | None = None


class InstanceIdle(Payload):
    type = EventType.INSTANCE_IDLE
    instance: str
    idle_since: float
    terminate_at: float


class InstanceReminder(Payload):
    type = EventType.INSTANCE_REMINDER
    instance: str
    until: float
    in_s: int


class InstanceStuck(Payload):
    type = EventType.INSTANCE_STUCK
    instance: str
    since: float
    attempts: int
    price_per_hour: float | None = None
    provider_id: str | None = None


class InstanceLost(Payload):
    type = EventType.INSTANCE_LOST
    instance: str
    looks: int


class ReapTerminated(Payload):
    type = EventType.REAP_TERMINATED
    instance: str
    why: str


class NodeJoined(Payload):
    """A Ray node of the run's cluster, as its head's State API lists it, and how many have joined."""

    type = EventType.NODE_JOINED
    node_id: str | None = None
    node_ip: str | None = None
    head: bool = False
    cpus: float = 0
    gpus: float = 0
    memory_gb: float = 0
    accelerator: str | None = None
    nodes: int
    of: int


# What the node did (the trainer's progress lines)


class RaySubmitted(Payload):
    type = EventType.PREPARE_SUBMITTED
    ray_job: str


class TrainSubmitted(RaySubmitted):
    type = EventType.TRAIN_SUBMITTED


class DownloadSummary(BaseModel):
    """What the node's download moved: bytes, files, seconds, MB/s, connections, ..."""

    model_config = ConfigDict(extra="allow", frozen=True)

    bytes: int = 0
    seconds: float = 0
    mb_per_s: float = 0


class PrepareFetched(NodeRecord):
    type = EventType.PREPARE_FETCHED
    model_path: str | None = None
    examples: int | None = None
    dataset_files: list[str] = Field(default_factory=list)
    download: DownloadSummary | None = None


class TrainStarted(NodeRecord):
    type = EventType.TRAIN_STARTED
    total_steps: int | None = None
    num_workers: int | None = None
    nodes: list[str | None] | None = None
    num_nodes: int | None = None
    train_examples: int | None = None
    eval_examples: int | None = None


class TrainStep(NodeRecord):
    type = EventType.TRAIN_STEP
    step: int
    total_steps: int | None = None
    loss: float | None = None
    learning_rate: float | None = None
    epoch: float | None = None


class TrainEval(NodeRecord):
    type = EventType.TRAIN_EVAL
    step: int | None = None
    eval_loss: float | None = None


class TrainCheckpoint(NodeRecord):
    type = EventType.TRAIN_CHECKPOINT
    step: int | None = None
    path: str | None = None


class TrainFinished(NodeRecord):
    type = EventType.TRAIN_FINISHED
    metrics: Metrics = Field(default_factory=dict)
    output_dir: str | None = None


class TrainResumed(NodeRecord):
    type = EventType.TRAIN_RESUMED
    step: int | None = None
    total_steps: int | None = None
    path: str | None = None
    source: str | None = None


class TrainRollback(NodeRecord):
    type = EventType.TRAIN_ROLLBACK
    step: int | None = None
    to_step: int | None = None
    reason: str | None = None
    loss: float | None = None
    learning_rate: float | None = None
    rollbacks: int | None = None


class TrainBatchSize(NodeRecord):
    type = EventType.TRAIN_BATCH_SIZE
    micro_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    tried: list[dict[str, JsonValue]] = Field(default_factory=list)


class TrainRestarted(Payload):
    type = EventType.TRAIN_RESTARTED
    restart: int
    after_step: int | None = None
    why: str


class FinalizePulled(Payload):
    type = EventType.FINALIZE_PULLED
    output_dir: str | None = None
    files: int
    bytes: int | None = None
    sha256: str | None = None
    unpack_seconds: float | None = None
    skipped: str | None = Field(None, description="Why the results stayed on the node (too large).")


# Sweeps


class SweepRow(BaseModel):
    """One child of a sweep in its table: the values the sweep set, and its final metric."""

    model_config = ConfigDict(extra="forbid")

    index: int
    run_id: str
    state: str
    params: dict[str, JsonValue] = Field(default_factory=dict)
    metric: int | float | None = None
    best: bool = False


class SweepStarted(Payload):
    type = EventType.SWEEP_STARTED
    sweep_id: str
    source: str
    runs: list[str]
    keys: list[str]
    max_parallel: int


class SweepSummary(BaseModel):
    """A sweep's state and its table: what its last event and its status views show."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sweep_id: str
    state: str
    source: str
    metric: str
    goal: str
    keys: list[str]
    rows: list[SweepRow]

    @property
    def best(self) -> SweepRow | None:
        return next((row for row in self.rows if row.best), None)


class SweepFinished(SweepSummary, Payload):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type = EventType.SWEEP_FINISHED


# The bot's audit trail


class BotAudit(Payload):
    """Who did it (Discord ids as text) and what."""

    user_id: str
    channel_id: str | None = None
    guild_id: str | None = None
    command: str


class BotRefused(BotAudit):
    type = EventType.BOT_REFUSED
    kind: str
    reason: str


class BotCommand(BotAudit):
    type = EventType.BOT_COMMAND
    run_id: str | None = None
    sweep_id: str | None = None
    instance: str | None = None
    force: bool | None = None


def _registry() -> Mapping[EventType, type[Payload]]:
    found: dict[EventType, type[Payload]] = {}
    pending: list[type[Payload]] = [Payload]
    while pending:
        for sub in pending.pop().__subclasses__():
            pending.append(sub)
            if "type" in vars(sub):
                found[sub.type] = sub
    return MappingProxyType(found)


PAYLOADS = _registry()
"""The payload model of each event type (a unit test checks that every type has one)."""


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
