"""What the run's node did: its Ray jobs submitted, and the trainer's progress lines (the model and data
fetched, training started, steps, evals, checkpoints, resumes, rollbacks, the result), then its results
pulled back."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from broker.payloads.base import EventType, Metrics, NodeRecord, Payload


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


class NodeSetup(NodeRecord):
    """What the node's start script installed because its image lacked it (providers.nodesetup)."""

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
    python: str | None = Field(None, description="The interpreter rank 0 trains with (the node's own).")
    precision: str | None = Field(
        None, description="What the forward passes compute in: bfloat16, float16, float32."
    )


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


class WandbUnavailable(NodeRecord):
    type = EventType.WANDB_UNAVAILABLE
    status: str = "unavailable"
    error: str | None = None


class TrainBatchSize(NodeRecord):
    type = EventType.TRAIN_BATCH_SIZE
    micro_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    tried: list[dict[str, JsonValue]] = Field(default_factory=list)


class PendingNode(BaseModel):
    """One node of the cluster as a PENDING line shows it: its resources in all and free, how many of the
    workers' bundles it holds."""

    model_config = ConfigDict(extra="allow", frozen=True)

    node_id: str | None = None
    total: dict[str, float] = Field(default_factory=dict)
    available: dict[str, float] = Field(default_factory=dict)
    fit: int | None = None


class TrainPending(NodeRecord):
    """Ray cannot place the training workers (trainer.placement): `workers` bundles of `per_worker`, each
    on one node, against what the nodes have; repeated while it waits; `gave_up` on the last (it fails)."""

    type = EventType.TRAIN_PENDING
    workers: int
    per_worker: dict[str, float]
    demand: str | None = Field(None, description="The demand as one line: `2 x {CPU: 1}`.")
    nodes: list[PendingNode] = Field(default_factory=list)
    cluster: str | None = Field(None, description="The nodes' free/total resources as one line.")
    why: str | None = None
    waited_s: float = 0.0
    limit_s: float | None = None
    report: int | None = Field(None, description="The line's number in its wait: 1 when the wait begins.")
    gave_up: bool = False


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
