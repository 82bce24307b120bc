"""What the run's node did: its Ray jobs submitted, and the trainer's progress lines (the model and data
fetched, training started, steps, evals, checkpoints, resumes, rollbacks, the result), then its results
pulled back."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from state.payloads.base import EventType, NodeRecord, Payload
from trainer import lines


class NodeCheck(BaseModel):
    """What the node's readiness check found (trainer.nodecheck's CHECKED line, less its problems): the
    interpreter that trains, the libraries' versions, and the GPUs CUDA sees."""

    model_config = ConfigDict(extra="allow", frozen=True)

    python: str
    executable: str
    versions: dict[str, str] = Field(default_factory=dict)
    cuda: bool = False
    cuda_version: str | None = None
    gpus: int = 0
    gpu_names: list[str] = Field(default_factory=list)
    bf16: bool = False
    cpu_standin: bool = Field(False, description="A test fake's node standing in for GPUs on the CPU.")
    axolotl_source: dict[str, str] | None = Field(
        None, description="Where a fork of axolotl came from: its git url, the ref asked for, the commit got."
    )


class NodeSetup(NodeRecord):
    """What the node's start script installed because its image lacked it (providers.onnode.nodesetup)."""

    type = EventType.NODE_SETUP
    seconds: float = 0.0
    installed: list[str] = Field(default_factory=list)
    python: str | None = Field(None, description="The interpreter Ray and the trainer run with.")
    venv: str | None = None
    error: str | None = Field(None, description="Why the install failed (the readiness check then fails).")


class NodeReady(Payload):
    """The node passed its readiness check: it can train (head only, on a cluster)."""

    type = EventType.NODE_READY
    instance: str
    check: NodeCheck
    remembered: bool = Field(
        False, description="The check passed on an earlier node with the same software (workers.readiness)."
    )


class RaySubmitted(Payload):
    type = EventType.PREPARE_SUBMITTED
    ray_job: str


class TrainSubmitted(RaySubmitted):
    type = EventType.TRAIN_SUBMITTED


class PrepareEntry(Payload):
    """The job's `entry` script ended on the node (its own Ray job, before the fetch)."""

    type = EventType.PREPARE_ENTRY
    ray_job: str
    status: str = Field(description="The Ray job's end: SUCCEEDED, FAILED or STOPPED.")
    exit_code: int | None = None
    seconds: float | None = Field(None, description="How long the script ran, by the node's clock.")
    output: str = Field("", description="The end of what it printed, the fleet's credentials taken out.")


class PrepareFetched(lines.Fetched, NodeRecord):
    type = EventType.PREPARE_FETCHED


class TrainStarted(lines.Started, NodeRecord):
    type = EventType.TRAIN_STARTED


class TrainStep(lines.Step, NodeRecord):
    type = EventType.TRAIN_STEP


class TrainEval(lines.Eval, NodeRecord):
    type = EventType.TRAIN_EVAL


class TrainCheckpoint(lines.Checkpoint, NodeRecord):
    type = EventType.TRAIN_CHECKPOINT


class TrainFinished(lines.Finished, NodeRecord):
    type = EventType.TRAIN_FINISHED


class TrainResumed(lines.Resumed, NodeRecord):
    type = EventType.TRAIN_RESUMED


class TrainRollback(lines.Rollback, NodeRecord):
    type = EventType.TRAIN_ROLLBACK


class WandbUnavailable(lines.WandbUnavailable, NodeRecord):
    type = EventType.WANDB_UNAVAILABLE


class TrainBatchSize(lines.BatchSize, NodeRecord):
    type = EventType.TRAIN_BATCH_SIZE


class TrainPending(lines.Pending, NodeRecord):
    type = EventType.TRAIN_PENDING


class TrainStopped(lines.Stopped, NodeRecord):
    type = EventType.TRAIN_STOPPED


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
