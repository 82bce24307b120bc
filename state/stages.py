"""A run's way through the fleet: its stages in order (Stage: each a Celery queue and task of the same name),
its states (RunState), and the one table of what the fleet knows of each stage (STAGES), from which every
per-stage table is derived."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from core.errors import FailureReason


class Stage(StrEnum):
    """A run's stages; each is a Celery queue of the same name with one task."""

    PROVISION = "provision"
    PREPARE = "prepare"
    TRAIN = "train"
    FINALIZE = "finalize"

    @property
    def task_name(self) -> str:
        return f"trainfleet.{self.value}"

    @property
    def following(self) -> Stage:
        """The stage a run goes to when this one is done: the order above is the only place that says it.
        Finalize is the last; after it the run has ended."""
        order = list(Stage)
        at = order.index(self)
        if at + 1 == len(order):
            raise ValueError(f"{self.value} is the last stage")
        return order[at + 1]


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


@dataclass(frozen=True)
class StageFacts:
    """What the fleet knows of one stage: every per-stage table is read from STAGES (the stages' order,
    the way a run goes, is Stage's)."""

    state: RunState  # a run's state while the stage acts on it
    failure: FailureReason  # why the run failed when the stage fails it (and the error names no reason)
    time_limit: str  # the core.settings.Settings field with its task's soft time limit, in seconds
    on_node: (
        bool  # it works on the run's node: a retryable error there is first asked whether the node is lost
    )
    module: str  # the workers module with its task, and `relay` if its node job's lines are events as printed


STAGES: Mapping[Stage, StageFacts] = MappingProxyType(
    {
        Stage.PROVISION: StageFacts(
            state=RunState.PROVISIONING,
            failure=FailureReason.PROVISIONING_FAILED,
            time_limit="provision_time_limit_s",
            on_node=False,
            module="workers.stages.provision",
        ),
        Stage.PREPARE: StageFacts(
            state=RunState.PREPARING,
            failure=FailureReason.PREPARE_FAILED,
            time_limit="prepare_time_limit_s",
            on_node=True,
            module="workers.stages.prepare",
        ),
        Stage.TRAIN: StageFacts(
            state=RunState.TRAINING,
            failure=FailureReason.TRAINING_FAILED,
            time_limit="train_time_limit_s",
            on_node=True,
            module="workers.stages.train",
        ),
        Stage.FINALIZE: StageFacts(
            state=RunState.FINALIZING,
            failure=FailureReason.FINALIZE_FAILED,
            time_limit="finalize_time_limit_s",
            on_node=True,
            module="workers.stages.finalize",
        ),
    }
)
_STAGE_OF = {RunState.QUEUED: Stage.PROVISION, **{facts.state: stage for stage, facts in STAGES.items()}}
