"""The node protocol typed once: what each of the trainer's progress lines says.

The trainer builds these models and prints them (`emit`; trainer.progress carries them, one JSON object
per line behind a marker). The fleet reads the same models back: its events for these lines
(state.payloads.node) are these classes with an event type added, the train stage's relay finds a line's
event through its `kind`, and the ledger's run progress takes its step fields from `StepFields`. A field
is named here and nowhere else.

Built strictly: a field these models do not declare is an error at the trainer's own line (mypy's pydantic
plugin sees it first), while the fleet's events keep what a line brings beyond them. Not here: CHECKED
(trainer.nodecheck imports only the standard library, so that a node lacking the trainer's libraries can
still say which; the fleet's state.payloads.node.NodeCheck reads it), CHUNK and PACKED (written and read
back by trainer.pack alone) and DONE (no fields).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from trainer import progress
from trainer.progress import Kind


class Record(BaseModel):
    """A line's fields, or a part of them."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Line(Record):
    """One progress line: `kind` says which."""

    kind: ClassVar[Kind]


def emit(line: Line) -> None:
    """Print `line` (rank 0 only): the fields it was given, as json writes them (NaN stays NaN)."""
    progress.emit(line.kind, **fields(line))


def fields(line: Line) -> dict[str, Any]:
    """The fields `line` was given, as plain data."""
    return line.model_dump(exclude_unset=True)


class Repo(Record):
    """One repository a fetch downloaded."""

    repo_id: str
    type: str
    sha: str


class Download(Record):
    """What a fetch's downloads moved, all repos together."""

    bytes: int = 0
    files: int = 0
    seconds: float = 0.0
    mb_per_s: float = 0.0
    connections: int = 0
    bytes_skipped: int = 0
    repos: list[Repo] = Field(default_factory=list)


class Fetched(Line):
    """The base model and datasets are resolved on the node (`python -m trainer fetch`)."""

    kind = Kind.FETCHED
    model_path: str | None = None
    examples: int | None = None
    dataset_files: list[str] = Field(default_factory=list)
    download: Download | None = None


class Started(Line):
    """Training started: its plan, and where each rank runs."""

    kind = Kind.STARTED
    total_steps: int | None = None
    num_workers: int | None = None
    nodes: list[str | None] | None = Field(None, description="The Ray node of each rank.")
    num_nodes: int | None = None
    train_examples: int | None = None
    eval_examples: int | None = None
    python: str | None = Field(None, description="The interpreter rank 0 trains with (the node's own).")
    precision: str | None = Field(
        None, description="What the forward passes compute in: bfloat16, float16, float32."
    )


class StepFields(Record):
    """Where training stands at a step (the ledger keeps the latest)."""

    step: int | None = Field(None, description="The trainer's latest step.")
    total_steps: int | None = Field(None, description="Optimizer steps the trainer plans.")
    loss: float | None = Field(None, description="The training loss at the step.")
    learning_rate: float | None = None
    epoch: float | None = None


class Step(Line, StepFields):
    """A logged optimizer step (the mean loss over all workers since the last)."""

    kind = Kind.STEP
    step: int  # always given


class Eval(Line):
    kind = Kind.EVAL
    step: int | None = None
    eval_loss: float | None = None


class Checkpoint(Line):
    kind = Kind.CHECKPOINT
    step: int | None = None
    path: str | None = None
    hub: str | None = Field(None, description="The Hub folder the checkpoint went to (hub_strategy).")


class Resumed(Line):
    """Training went on from a checkpoint."""

    kind = Kind.RESUMED
    step: int | None = None
    total_steps: int | None = None
    path: str | None = None
    source: str | None = Field(None, description="Where the checkpoint was: local or ray.")


class Stopped(Line):
    """The machine is going (a stop notice): a checkpoint at `step` is kept, and the trainer waits to
    be killed with its machine (trainer.stopnotice)."""

    kind = Kind.STOPPED
    step: int
    why: str = Field(description="SIGTERM, or the node's stop notice.")
    saved_in_s: float = Field(description="From the notice seen to the checkpoint kept.")


class Rollback(Line):
    """The loss watchdog tripped: back to an earlier step with a lower learning rate."""

    kind = Kind.ROLLBACK
    step: int | None = None
    to_step: int | None = None
    reason: str | None = None
    loss: float | None = Field(None, description="The loss that tripped it (high_loss only).")
    learning_rate: float | None = None
    rollbacks: int | None = None


class Trial(Record):
    """One micro batch size the search tried."""

    size: int
    fits: bool


class BatchSize(Line):
    """The micro batch size training uses, and what the search tried for it."""

    kind = Kind.BATCH_SIZE
    micro_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    tried: list[Trial] = Field(default_factory=list)


class Finished(Line):
    """Training finished: its metrics (metrics.json), and where the results are."""

    kind = Kind.FINISHED
    metrics: dict[str, JsonValue] = Field(default_factory=dict)
    output_dir: str | None = None


class PendingNode(Record):
    """One node of the cluster as a PENDING line shows it: its resources in all and free, how many of the
    workers' bundles it holds."""

    node_id: str | None = None
    total: dict[str, float] = Field(default_factory=dict)
    available: dict[str, float] = Field(default_factory=dict)
    fit: int | None = None


class Pending(Line):
    """Ray cannot place the training workers (trainer.placement): `workers` bundles of `per_worker`, each
    on one node, against what the nodes have; repeated while it waits; `gave_up` on the last (it fails)."""

    kind = Kind.PENDING
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


class WandbUnavailable(Line):
    """W&B could not be opened (down, or the key refused since submit): the trainer trains on without it."""

    kind = Kind.WANDB
    status: str = "unavailable"
    error: str | None = None


class Pushed(Line):
    """The results are on the HF Hub (`python -m trainer push`)."""

    kind = Kind.PUSHED
    repo_id: str
    commit: str | None = None
    url: str | None = None
