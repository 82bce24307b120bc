"""Typed state of the ledger: runs, instances, their states and failure reasons, and events."""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from core.errors import FailureReason, Unreachable
from jobs.sections import CloudSection, ProviderName, RemoteSection, SectionBase
from jobs.spec import JobSpec
from state.payloads import HubPush, Metrics, NodeCheck, Origin
from state.stages import RunState, Stage
from trainer.config import WandbPlan
from trainer.lines import StepFields


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


class Retrying(BaseModel):
    """A stage whose step keeps failing with errors that may pass (run.retrying): the bound's clock."""

    model_config = ConfigDict(extra="forbid")

    stage: Stage
    since: float = Field(description="When the first failure of this streak came (epoch seconds).")
    failures: int = Field(0, description="Failed tries of the step in a row.")


class Unreached(BaseModel):
    """A cause for which the fleet's calls to a starting node's Ray head got no answer (provision), said
    once in a node.unreachable event; a permanent one's `since` is the start of the bound on it."""

    model_config = ConfigDict(extra="forbid")

    instance: str
    cause: Unreachable
    since: float = Field(description="When provision first met it for this instance (epoch seconds).")
    detail: str = Field(description="Its words then (the TLS library's, the HTTP status).")
    endpoint: str = Field(description="The URL called (it names the node; never a credential).")


class StopSeen(BaseModel):
    """A train Ray job that ended after its trainer was told its machine is going (a STOPPED line), and
    when the train stage first saw it ended: the machine's loss is awaited from then (stopped_node_wait_s)."""

    model_config = ConfigDict(extra="forbid")

    job: str
    at: float = Field(description="Epoch seconds.")


class Placement(BaseModel):
    """Where a `cloud:` job's attempt was rented (provision's choice among the clouds), and, once the run
    moved on from it, why."""

    model_config = ConfigDict(extra="forbid")

    attempt: int
    cloud: ProviderName
    offer: str = Field(
        description="The cloud's offer id (a GPU type and cloud type, the ask's id; a pool's machine: "
        "POOL/MACHINE)."
    )
    gpu: str = Field(description="The GPU type in the fleet's names (jobs.gpus).")
    vendor_gpu: str = Field(description="The cloud's own name for it, as its section is written.")
    secure: bool = Field(description="A datacenter host (the section's cloud_type for this offer).")
    price_per_hour: float
    at: float = Field(
        default_factory=time.time, description="When it was chosen: the node's deadline counts from it."
    )
    left: str | None = Field(None, description="Why the run moved on to another offer (None: still on it).")

    @property
    def key(self) -> str:
        """The offer's identity across clouds, as providers.offers.Candidate.key writes it."""
        return f"{self.cloud.value}:{self.offer}"


class RunProgress(StepFields):
    """What the stages have learned about a run as it went; each stage writes its own fields (train: the
    latest STEP line's, trainer.lines.StepFields)."""

    model_config = ConfigDict(extra="forbid", frozen=False, validate_assignment=True)

    wandb: WandbPlan | None = Field(None, description="The run's W&B run, decided as provision starts.")
    cluster: list[str] = Field(
        default_factory=list, description="The Ray node ids that have joined the run's head (provision)."
    )
    finished: bool = Field(False, description="The train job reported its result.")
    done: str | None = Field(
        None, description="The train Ray job (submission id) whose last line said it is done (trainer DONE)."
    )
    train_restarts: int = Field(0, description="Times a killed or crashed train job was run again.")
    entry_ended: str | None = Field(
        None, description="The `entry` Ray job (submission id) whose end prepare recorded (prepare.entry)."
    )
    fetched: str | None = Field(
        None, description="The fetch Ray job (submission id) whose prepare.fetched event was recorded."
    )
    hub: HubPush | None = Field(None, description="The results are on the HF Hub (finalize).")
    pulled: bool = Field(False, description="The results came back from a rented node (finalize).")
    waiting: str | None = Field(
        None, description="What provision waits on (every machine that fits held), as last said."
    )
    unreached: list[Unreached] = Field(
        default_factory=list,
        description="Why the run's starting nodes did not answer, each cause once per instance (provision).",
    )
    placements: list[Placement] = Field(
        default_factory=list,
        description="A `cloud:` job's offers, one per attempt that rented (or tried to), the latest last.",
    )
    stop_seen: StopSeen | None = Field(
        None, description="The latest train job that ended on its machine's stop notice (train)."
    )
    axolotl_commit: str | None = Field(
        None,
        description="The commit of the section's axolotl fork the run's first node installed (provision's "
        "readiness check); every later node installs it.",
    )

    @property
    def pushed(self) -> bool:
        return self.hub is not None


class Run(BaseModel):
    """One job's way through the fleet. Stored as JSON; never holds a secret."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    state: RunState = RunState.QUEUED
    provider: ProviderName
    source: str = Field(description="Where the job came from (a file name, 'discord', ...).")
    spec: JobSpec = Field(description="The validated job.")
    run_dir: str
    output_dir: str
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    attempt: int = Field(1, description="Which node the run is on: 1, then +1 for each replacement.")
    preemptions: int = Field(0, description="Nodes lost under the run (preempted) and replaced.")
    boot_losses: int = Field(0, description="Of those, the nodes that stopped before they came up.")
    spot_left: str | None = Field(
        None, description="Why a `pod_type: auto` run left spot for on-demand machines; None: it has not."
    )
    instance: str | None = None
    stages: list[StageTiming] = Field(default_factory=list)
    failure_reason: FailureReason | None = None
    failure_message: str | None = None
    cancel_requested: bool = False
    ray_jobs: dict[str, str] = Field(default_factory=dict, description="stage -> Ray submission id")
    resent: list[str] = Field(
        default_factory=list,
        description="Ray jobs sent again because Ray could not set up their runtime environment (once each).",
    )
    log_offset: int = Field(0, description="Characters of the train job's log already relayed.")
    progress: RunProgress = Field(default_factory=RunProgress)
    metrics: Metrics = Field(
        default_factory=dict, description="The trainer's metrics (eval loss first, last)."
    )
    event_seq: int = 0
    sweep_id: str | None = Field(None, description="The sweep this run is a child of.")
    params: dict[str, JsonValue] = Field(
        default_factory=dict, description="The keys a sweep set for this child (key -> value)."
    )
    held: bool = Field(
        False, description="A sweep child waiting (QUEUED) for a free slot under the sweep's max_parallel."
    )
    origin: Origin | None = Field(
        None, description="Where the job came from beyond its file (a commit, a Discord user); None: the CLI."
    )
    ceiling_per_hour: float | None = Field(
        None,
        description="The most an hour of its nodes may cost where its section has no bid cap (a pool's "
        "machines, priced at submit: service.pricecap); state.worstcase reads it.",
    )
    retrying: Retrying | None = Field(None, description="Its stage's step is being retried (workers.stage).")
    stopping: str | None = Field(
        None,
        description="Why it is being stopped for money (a cap passed): finalize brings its results and "
        "checkpoints back from the node, then it fails OVER_BUDGET with this message (workers.budget).",
    )
    kicks: int = Field(0, description="Times the reaper re-sent its stage task since a step last ended.")
    kicked_starts: int = Field(
        0, description="Stage tasks that started after such a kick and have not ended a step (STALLED)."
    )

    @model_validator(mode="before")
    @classmethod
    def _as_older_ledgers_wrote_it(cls, data: Any) -> Any:
        """A run written before the ledger was typed: no origin was `{}`, and its progress said `pushed`
        beside `hub` (now derived from it)."""
        if not isinstance(data, dict):
            return data
        if data.get("origin") == {}:
            data = {**data, "origin": None}
        progress = data.get("progress")
        if isinstance(progress, dict) and "pushed" in progress:
            data = {**data, "progress": {k: v for k, v in progress.items() if k != "pushed"}}
        return data

    @model_validator(mode="after")
    def _provider_is_the_jobs(self) -> Run:
        if self.provider == self.spec.provider:
            return self
        section = self.spec.section
        if isinstance(section, CloudSection) and section.allows(self.provider):
            return self  # a `cloud:` job's run is on the cloud its provision chose
        raise ValueError(f"provider {self.provider} is not the job's ({self.spec.provider})")

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
        return self.spec.section.num_nodes

    def instance_names_of(self, attempt: int) -> list[str]:
        """The deterministic names of an attempt's instances, node 0 (the Ray head) first: tf-<run>-<attempt>
        for a one-node run, tf-<run>-<attempt>-<k> (k = 0 .. num_nodes-1) for a cluster."""
        base = f"tf-{self.run_id}-{attempt}"
        return [base] if self.num_nodes == 1 else [f"{base}-{k}" for k in range(self.num_nodes)]

    @property
    def placement(self) -> Placement | None:
        """A `cloud:` job's offer for this attempt (None: none chosen yet, or not a `cloud:` job)."""
        last = self.progress.placements[-1] if self.progress.placements else None
        return last if last is not None and last.attempt == self.attempt else None

    def node_section(self, node: int) -> SectionBase:
        """The section that rents node `node` of this attempt: a `cloud:` job's, its cloud's own section for
        the offer chosen (ValueError before one is); any other job's, its section's (`node_section`). A
        `pod_type: auto` section rents spot until the run left spot (`spot_left`), then on demand."""
        section = self.spec.section
        if not isinstance(section, CloudSection):
            chosen = section.node_section(node)
        else:
            placed = self.placement
            if placed is None:
                raise ValueError(f"run {self.run_id}: no offer chosen for attempt {self.attempt} yet")
            chosen = section.on(placed.cloud, placed.vendor_gpu, placed.secure, placed.offer)
        return chosen.renting(self.spot_left) if isinstance(chosen, RemoteSection) else chosen

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
    provider: ProviderName = Field(description="The cloud that rents it (never `cloud`: a choice).")
    run_id: str
    head: str | None = Field(
        None, description="A cluster's worker node: the instance whose Ray head it joins (None: a head)."
    )
    state: InstanceState = InstanceState.REQUESTED
    provider_id: str | None = None
    price_per_hour: float | None = None
    dashboard_url: str | None = None
    check: NodeCheck | None = Field(None, description="What its readiness check found (a head only).")
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
