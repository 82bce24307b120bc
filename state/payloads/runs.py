"""What the fleet itself reports about a run and its instances: its life from queued to its end, the
instances it asked for, kept, found idle, stuck or lost, and the Ray nodes that joined its cluster."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, JsonValue, Tag

from core.errors import FailureReason, Unreachable
from core.policy_settings import Submitter
from jobs.sections import ProviderName
from state.payloads.base import EventType, Metrics, Payload
from state.stages import Stage
from trainer import lines


class HubPush(lines.Pushed, Payload):
    """The run's results are on the HF Hub (what the node's PUSHED progress line said)."""

    type = EventType.FINALIZE_PUSHED


class GitOrigin(BaseModel):
    """Where a run from the git trigger came from: the repository, branch, commit and config path."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["git"] = "git"
    repo: str
    branch: str | None = None
    commit: str
    path: str | None = None
    since: str | None = Field(None, description="`fleet enqueue --changed-since`: the base it compared to.")

    @property
    def submitter(self) -> Submitter:
        return Submitter.git(self.repo)


class DiscordOrigin(BaseModel):
    """Who started a run from Discord (/train, /sweep): their user id and, as the command carried them,
    their role ids (ids only)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["discord"] = "discord"
    user_id: str
    role_ids: tuple[str, ...] = ()

    @property
    def submitter(self) -> Submitter:
        return Submitter.discord(self.user_id, self.role_ids)


def _origin_kind(value: Any) -> str | None:
    """Which origin `value` is: its `kind`, which events leave out (a default), else told by its fields."""
    if isinstance(value, dict):
        return str(value.get("kind") or ("discord" if "user_id" in value else "git"))
    return getattr(value, "kind", None)


# Where a run came from beyond its file; None: the fleet's CLI.
Origin = Annotated[
    Annotated[GitOrigin, Tag("git")] | Annotated[DiscordOrigin, Tag("discord")], Discriminator(_origin_kind)
]


def submitter_of(origin: GitOrigin | DiscordOrigin | None) -> Submitter:
    """Who submitted a run that came from `origin` (None: the CLI)."""
    return Submitter.cli() if origin is None else origin.submitter


# The run's life


class RunQueued(Payload):
    type = EventType.RUN_QUEUED
    source: str
    provider: ProviderName
    warnings: list[str] = Field(default_factory=list)
    sweep_id: str | None = None
    params: dict[str, JsonValue] | None = None
    held: bool | None = None
    origin: Origin | None = None


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
    kick: int | None = Field(None, description="Kicks since the run's last step that ended.")
    stalled_after: int | None = Field(
        None, description="Tasks started after kicks that may die before the run fails STALLED."
    )


class RunRetrying(Payload):
    """A stage's step failed with an error that may pass (the provider down, no capacity, the node not
    answering, a step past its time limit): it is tried again in `retry_in_s`, until `gives_up_at` or
    `max_failures`, then the run fails with the error."""

    type = EventType.RUN_RETRYING
    stage: Stage
    attempt: int = Field(description="Failures of the step in a row, this one included.")
    max_failures: int
    error: str = Field(description="The error's kind (ProviderUnavailable, NoCapacity, NodeError, ...).")
    why: str = Field(description="The error's message, without credentials.")
    retry_in_s: float
    gives_up_at: float = Field(description="When the run fails if the step has not got through (epoch s).")


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


# A `cloud:` job's offers


class OfferChosen(Payload):
    type = EventType.OFFER_CHOSEN
    attempt: int
    cloud: ProviderName
    gpu: str = Field(description="The GPU type in the fleet's names.")
    offer: str = Field(description="The cloud's offer id.")
    price_per_hour: float
    fits: int = Field(description="Offers that fitted, across the clouds asked.")
    unasked: list[str] = Field(default_factory=list, description="Clouds not asked, and why.")


class OfferLeft(Payload):
    type = EventType.OFFER_LEFT
    attempt: int
    cloud: ProviderName
    gpu: str
    offer: str
    why: str
    instance: str


# Instances and nodes


class VolumeReady(Payload):
    """The storage volume a node mounts (`network_volume:`), made for the run or found from an earlier one
    of its name, and what it costs a month (it bills until `fleet volumes --delete`)."""

    type = EventType.VOLUME_READY
    instance: str
    volume_id: str
    name: str
    where: str
    size_gb: int
    monthly_usd: float
    made: bool


class InstanceWaiting(Payload):
    """Every machine that fits the run is held by other runs (a pool's): it waits for one, in provision,
    for as long as that takes (or until cancelled); said again only when what it waits on changes."""

    type = EventType.INSTANCE_WAITING
    why: str = Field(description="The machines and the runs that hold them.")


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


class NodeUnreachable(Payload):
    """The fleet's call to a starting node's Ray head got no answer, for a cause not said before for that
    node: the cause, the URL called (which names the node, never a credential) and the TLS library's or
    the HTTP answer's words. A `permanent` cause (a certificate the fleet's check refuses) fails the run
    NODE_UNREACHABLE at `gives_up_at` if it lasts; the others are a booting node's, waited out."""

    type = EventType.NODE_UNREACHABLE
    instance: str
    cause: Unreachable
    endpoint: str
    detail: str
    permanent: bool
    gives_up_at: float | None = None


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
