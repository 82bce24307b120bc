"""How a run and its events are shown: one line per event (`fleet logs`, Discord), a run as `fleet status
--json` prints it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field, JsonValue, TypeAdapter

from broker.constants import Stage
from broker.cost import run_cost
from broker.models import Run, RunProgress, RunState
from broker.payloads import (
    Event,
    GitOrigin,
    Metrics,
    PrepareEntry,
    RunSucceeded,
    TrainFinished,
    TrainPending,
)
from core.errors import FailureReason
from jobs.sections import ProviderName
from service.runs import Fleet
from trainer.config import AxolotlConfig


def format_value(value: Any) -> str:
    """A value as the views show it: floats to 4 significant digits, nothing as '-'."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


_HEADLINE_METRICS = ("eval_loss_first", "eval_loss", "train_loss", "global_step", "train_runtime_s")


def describe(event: Event) -> str:
    """One line for an event: time, type, and its data as key=value."""
    stamp = datetime.fromtimestamp(event.time, UTC).strftime("%H:%M:%S")
    data = event.data.wire()
    if isinstance(event.data, RunSucceeded | TrainFinished):
        metrics = event.data.metrics
        shown = {k: metrics.get(k) for k in _HEADLINE_METRICS if k in metrics}
        data = {"output_dir": event.data.output_dir, **shown}
    if isinstance(event.data, PrepareEntry):  # one line: its output's last line (all of it in --json)
        lines = [line for line in event.data.output.splitlines() if line.strip()]
        data = {**data, "output": ("…" if len(lines) > 1 else "") + (lines[-1][-200:] if lines else "")}
    if isinstance(event.data, TrainPending):  # one line: the demand against the nodes (all in --json)
        data = pending_fields(event.data)
    parts = " ".join(f"{k}={format_value(v)}" for k, v in data.items() if v not in (None, [], {}, ""))
    return f"{stamp} {event.type.value:<22} {parts}".rstrip()


def pending_fields(pending: TrainPending) -> dict[str, Any]:
    """A train.pending event as its line shows it: the demand, the cluster, the wait so far and its bound."""
    limit = f"/{pending.limit_s:g}" if pending.limit_s is not None else ""
    return {
        "demand": f'"{pending.demand or pending.per_worker}"',
        "cluster": f'"{pending.cluster}"' if pending.cluster else None,
        "waited_s": f"{pending.waited_s:g}{limit}",
        "gave_up": pending.gave_up or None,
    }


class StageView(BaseModel):
    """One stage of a run: when it started and ended, and how long it took (seconds)."""

    name: Stage
    started: float | None
    ended: float | None
    seconds: float | None


class RunView(BaseModel):
    """A run as `fleet status --json` prints it: the ledger's record, its instances, what it cost so far."""

    run_id: str
    state: RunState
    provider: ProviderName
    trainer: str = Field(description="The trainer: `builtin`, or `axolotl <release>`.")
    source: str
    created_at: float
    updated_at: float
    attempt: int
    preemptions: int
    instance: str | None
    instances: list[str] = Field(description="A cluster's instances, the head first; [] before the first.")
    stages: list[StageView]
    output_dir: str
    failure_reason: FailureReason | None
    failure_message: str | None
    cancel_requested: bool
    sweep_id: str | None
    params: dict[str, JsonValue]
    held: bool
    origin: GitOrigin | None
    progress: RunProgress
    metrics: Metrics
    cost_usd: float


RUN_VIEWS = TypeAdapter(list[RunView])


def trainer_of(run: Run) -> str:
    """`builtin`, or `axolotl 0.19.0` (the release its nodes train with)."""
    train = run.spec.train
    if isinstance(train, AxolotlConfig):
        return f"axolotl {train.axolotl_version}" if train.axolotl_version else "axolotl"
    return "builtin"


def run_view(fleet: Fleet, run: Run) -> RunView:
    """A run as `fleet status RUN` shows it (with what its instances cost so far)."""
    stages = [StageView(name=t.name, started=t.started, ended=t.ended, seconds=t.seconds) for t in run.stages]
    return RunView(
        **run.model_dump(
            include=set(RunView.model_fields) - {"instances", "stages", "metrics", "cost_usd", "trainer"}
        ),
        trainer=trainer_of(run),
        instances=run.instance_names if run.instance else [],
        stages=stages,
        metrics={"eval_loss_first": None, "eval_loss": None, **run.metrics},
        cost_usd=run_cost(fleet.ledger, run),
    )
