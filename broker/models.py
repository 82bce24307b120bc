"""Typed state of the ledger: runs, instances, their states and failure reasons, and events."""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from broker.constants import Stage
from core.errors import FailureReason


class RunState(StrEnum):
    """A run's life: QUEUED -> PROVISIONING -> PREPARING -> TRAINING -> FINALIZING -> an end."""

    QUEUED = "QUEUED"
    PROVISIONING = "PROVISIONING"
    PREPARING = "PREPARING"
    TRAINING = "TRAINING"
    FINALIZING = "FINALIZING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    def is_terminal(self) -> bool:
        return self in (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED)

    @property
    def stage(self) -> Stage | None:
        """The stage whose task acts on a run in this state (QUEUED is provision's to pick up)."""
        return _STAGE_OF.get(self)


_STAGE_OF = {
    RunState.QUEUED: Stage.PROVISION,
    RunState.PROVISIONING: Stage.PROVISION,
    RunState.PREPARING: Stage.PREPARE,
    RunState.TRAINING: Stage.TRAIN,
    RunState.FINALIZING: Stage.FINALIZE,
}
STATE_OF_STAGE = {
    Stage.PROVISION: RunState.PROVISIONING,
    Stage.PREPARE: RunState.PREPARING,
    Stage.TRAIN: RunState.TRAINING,
    Stage.FINALIZE: RunState.FINALIZING,
}


class InstanceState(StrEnum):
    """An instance as the ledger knows it. TERMINATED only once the provider no longer lists it."""

    REQUESTED = "REQUESTED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    TERMINATING = "TERMINATING"
    TERMINATED = "TERMINATED"
    LOST = "LOST"

    def is_terminal(self) -> bool:
        return self in (InstanceState.TERMINATED, InstanceState.LOST)


class StageTiming(BaseModel):
    """When a stage started and ended (epoch seconds)."""

    name: Stage
    started: float | None = None
    ended: float | None = None

    @property
    def seconds(self) -> float | None:
        if self.started is None or self.ended is None:
            return None
        return round(self.ended - self.started, 3)


class Run(BaseModel):
    """One job's way through the fleet. Stored as JSON; never holds a secret."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    state: RunState = RunState.QUEUED
    provider: str
    source: str = Field(description="Where the job came from (a file name, 'discord', ...).")
    spec: dict[str, Any] = Field(description="The validated job (JobSpec as JSON).")
    run_dir: str
    output_dir: str
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    attempt: int = Field(1, description="Which node the run is on: 1, then +1 for each replacement.")
    preemptions: int = Field(0, description="Nodes lost under the run (preempted) and replaced.")
    instance: str | None = None
    stages: list[StageTiming] = Field(default_factory=list)
    failure_reason: FailureReason | None = None
    failure_message: str | None = None
    cancel_requested: bool = False
    ray_jobs: dict[str, str] = Field(default_factory=dict, description="stage -> Ray submission id")
    log_offset: int = Field(0, description="Characters of the train job's log already relayed.")
    progress: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)
    event_seq: int = 0
    sweep_id: str | None = Field(None, description="The sweep this run is a child of.")
    params: dict[str, Any] = Field(
        default_factory=dict, description="The keys a sweep set for this child (key -> value)."
    )
    held: bool = Field(
        False, description="A sweep child waiting (QUEUED) for a free slot under the sweep's max_parallel."
    )
    origin: dict[str, Any] = Field(
        default_factory=dict,
        description="Where the job came from beyond its file, e.g. a git commit: {kind, repo, commit, path}.",
    )

    def stage(self, name: Stage) -> StageTiming:
        for timing in self.stages:
            if timing.name == name:
                return timing
        timing = StageTiming(name=name)
        self.stages.append(timing)
        return timing

    @property
    def num_nodes(self) -> int:
        """Machines in the run's Ray cluster (its provider section's `num_nodes`)."""
        return int((self.spec.get("section") or {}).get("num_nodes") or 1)

    def instance_names_of(self, attempt: int) -> list[str]:
        """The deterministic names of an attempt's instances, node 0 (the Ray head) first: tf-<run>-<attempt>
        for a one-node run, tf-<run>-<attempt>-<k> (k = 0 .. num_nodes-1) for a cluster."""
        base = f"tf-{self.run_id}-{attempt}"
        return [base] if self.num_nodes == 1 else [f"{base}-{k}" for k in range(self.num_nodes)]

    @property
    def instance_names(self) -> list[str]:
        """This attempt's instances, the head first."""
        return self.instance_names_of(self.attempt)

    @property
    def instance_name(self) -> str:
        """This attempt's node 0: the instance whose Ray head the fleet talks to."""
        return self.instance_names[0]


class Instance(BaseModel):
    """An instance the fleet asked a provider for (written as an intent before the create call)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    provider: str
    run_id: str
    head: str | None = Field(
        None, description="A cluster's worker node: the instance whose Ray head it joins (None: a head)."
    )
    state: InstanceState = InstanceState.REQUESTED
    provider_id: str | None = None
    price_per_hour: float | None = None
    dashboard_url: str | None = None
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    create_called_at: float | None = Field(
        None, description="When the last create call went out that may have made it (no clear answer)."
    )
    missed: int = Field(0, description="Looks in a row in which the provider did not list it.")
    keep_until: float | None = Field(
        None, description="Kept for debugging (one_shot: false, run failed): the reaper ends it after this."
    )
    reminded: bool = Field(False, description="The reminder that a kept instance is about to end was sent.")
    idle_since: float | None = Field(None, description="Idle (no active run) since; None while in use.")
    why_terminated: str | None = Field(None, description="Why the fleet asked for it to be terminated.")
    terminate_requested_at: float | None = Field(None, description="The first terminate call.")
    terminate_attempts: int = Field(0, description="Terminate calls made (retried until it is gone).")
    next_terminate_at: float = Field(0.0, description="No terminate call again before this (back-off).")


class Sweep(BaseModel):
    """A set of runs from one job file with different values for some keys; at most `max_parallel` of
    them are active at once, the others wait (held) in order. Stored as JSON; never holds a secret."""

    model_config = ConfigDict(extra="forbid")

    sweep_id: str
    source: str = Field(description="The job file (and the sweep file, when separate).")
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    max_parallel: int
    metric: str = "eval_loss"
    goal: str = Field("minimize", description="minimize or maximize the metric")
    keys: list[str] = Field(default_factory=list, description="The keys the sweep sets, in order.")
    runs: list[str] = Field(default_factory=list, description="The children's run ids, in order.")
    cancel_requested: bool = False
    finished_at: float | None = None


class EventType(StrEnum):
    """What an event reports. Events carry these values and structured data, never prose alone."""

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


class Event(BaseModel):
    """One thing that happened. `id` is unique and stable, so consumers can drop repeats."""

    model_config = ConfigDict(extra="forbid")

    id: str
    type: EventType
    run_id: str | None = None
    time: float = Field(default_factory=time.time)
    data: dict[str, Any] = Field(default_factory=dict)
