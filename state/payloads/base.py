"""The ground of every event: its type (`EventType`) and the payload base classes.

A payload knows its event type (`Payload.type`), so a stage writes `StageStarted(stage=...)` and the
ledger files it under `stage.started`. On the wire an event's data is the payload's fields as they were
given (unset ones left out), so `fleet logs --json`, the notifier and W&B read the same JSON as ever.

The fleet's own payloads are strict: a key that is not declared is a bug in its writer. The trainer's
progress lines (`train.*`, `prepare.fetched`) come from the node, which may run a newer trainer than this
fleet: their declared fields are checked and typed, and what else they carry is kept as it came (NodeRecord).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, JsonValue

Metrics = dict[str, JsonValue]
"""The trainer's result metrics (eval_loss_first, eval_loss, train_loss, global_step, ...)."""


class EventType(StrEnum):
    """What an event reports. Events carry these values and a typed payload, never prose alone."""

    RUN_QUEUED = "run.queued"
    WANDB_RUN = "wandb.run"
    WANDB_UNAVAILABLE = "wandb.unavailable"  # the trainer could not open the W&B run: it trains on without
    STAGE_STARTED = "stage.started"
    STAGE_FINISHED = "stage.finished"
    OFFER_CHOSEN = "offer.chosen"  # a `cloud:` job's attempt: the cloud and offer it rents, of how many
    OFFER_LEFT = "offer.left"  # ... and why the run moved on from one (no capacity, not ready in time)
    VOLUME_READY = "volume.ready"  # the network volume the run's nodes mount: made now, or found again
    INSTANCE_WAITING = "instance.waiting"  # every machine of its pool that fits is held: the run waits
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
    NODE_UNREACHABLE = "node.unreachable"  # a starting node's Ray head did not answer: a cause new for it
    NODE_JOINED = "node.joined"  # a Ray node joined the run's cluster (its head's State API lists it ALIVE)
    NODE_SETUP = "node.setup"  # what the node's start script installed that its image lacked, and how long
    NODE_READY = "node.ready"  # the node passed its readiness check (trainer.nodecheck): it can train
    PREPARE_SUBMITTED = "prepare.submitted"
    PREPARE_ENTRY = "prepare.entry"  # the job's `entry` script ran on the node: its status and output's tail
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
    TRAIN_PENDING = "train.pending"  # Ray cannot place the training workers yet: the demand, the nodes
    TRAIN_RESTARTED = "train.restarted"
    TRAIN_STOPPED = "train.stopped"  # told its machine is going, the trainer kept a checkpoint at a step
    FINALIZE_PUSHED = "finalize.pushed"
    FINALIZE_PULLED = "finalize.pulled"
    RUN_CANCEL_REQUESTED = "run.cancel_requested"
    RUN_SUCCEEDED = "run.succeeded"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"
    RUN_KICKED = "run.kicked"
    RUN_RETRYING = "run.retrying"  # a step failed with an error that may pass: why, when again
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
