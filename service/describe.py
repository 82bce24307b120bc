"""How a run and its events are shown: one line per event (`fleet logs`, Discord), a run as `fleet status
--json` prints it."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any, Literal

import redis
from pydantic import BaseModel, Field, JsonValue, TypeAdapter

from core.errors import FailureReason
from jobs.sections import ProviderName
from service.runs import Fleet
from state import events
from state.cost import run_cost
from state.models import Run, RunProgress
from state.payloads import (
    Event,
    Metrics,
    Origin,
    PrepareEntry,
    RunPreempted,
    RunSucceeded,
    TrainEval,
    TrainFinished,
    TrainPending,
    TrainRollback,
    TrainStep,
)
from state.stages import RunState, Stage
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


class CurveMark(BaseModel):
    """Where a run's training was set back: a rollback (to an earlier checkpoint, at a lower learning rate)
    or a preemption (its node lost; it resumed on the next)."""

    step: int
    kind: Literal["rollback", "preemption"]
    note: str = Field(description="e.g. 'rollback to 30 (nan)', 'preempted (2/3)'")


class LossCurve(BaseModel):
    """A run's losses as its node reported them, in order: a rollback or a resume shows as a step back."""

    train: list[tuple[int, float]] = Field(default_factory=list, description="[step, loss]: train.step")
    eval: list[tuple[int, float]] = Field(default_factory=list, description="[step, eval_loss]: train.eval")
    learning_rate: list[tuple[int, float]] = Field(default_factory=list, description="[step, lr]: train.step")
    marks: list[CurveMark] = Field(default_factory=list, description="train.rollback and run.preempted")


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
    spot_left: str | None = Field(None, description="Why a `pod_type: auto` run went on on demand.")
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
    origin: Origin | None
    progress: RunProgress
    metrics: Metrics
    cost_usd: float
    duration_s: float = Field(description="From queued to its end, or to now while it runs.")
    wandb_url: str | None = Field(description="Its W&B run's page, once known.")
    dashboard_url: str | None = Field(None, description="Its head's Ray dashboard (`fleet status RUN` only).")
    losses: LossCurve | None = Field(None, description="Its losses so far (`fleet status RUN` only).")


RUN_VIEWS = TypeAdapter(list[RunView])


def trainer_of(run: Run) -> str:
    """`builtin`, or `axolotl 0.19.0` (the release its nodes train with), or `axolotl URL@commit` (a fork)."""
    train = run.spec.train
    fork = run.spec.section.axolotl_fork()
    if isinstance(train, AxolotlConfig) and fork is not None:  # its fork, at the commit its nodes install
        url, branch = fork
        at = run.progress.axolotl_commit or branch or "its default branch"
        return f"axolotl {url.removeprefix('git+')}@{at}"
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
        duration_s=round(_ended_at(run) - run.created_at, 1),
        wandb_url=run.progress.wandb.url if run.progress.wandb is not None else None,
    )


def run_detail(fleet: Fleet, run: Run) -> RunView:
    """A run as `fleet status RUN` shows it: its view, its head's dashboard and its losses so far."""
    view = run_view(fleet, run)
    head = fleet.ledger.get_instance(run.instance) if run.instance else None
    view.dashboard_url = head.dashboard_url if head is not None else None
    view.losses = loss_curve(fleet.redis, run.run_id)
    return view


def loss_curve(client: redis.Redis[str], run_id: str) -> LossCurve:
    """The train and eval losses (and learning rate) of a run's train.step and train.eval events, in the
    order they came, with its rollbacks and preemptions (a preemption at the last step seen when the fleet
    did not know its step)."""
    curve = LossCurve()
    step = 0
    for _sid, event in events.read_run(client, run_id):
        data = event.data
        if isinstance(data, TrainStep):
            step = data.step
            if data.loss is not None:
                curve.train.append((data.step, data.loss))
            if data.learning_rate is not None:
                curve.learning_rate.append((data.step, data.learning_rate))
        elif isinstance(data, TrainEval) and data.eval_loss is not None and data.step is not None:
            curve.eval.append((data.step, data.eval_loss))
        elif isinstance(data, TrainRollback) and data.step is not None:
            to = f" to {data.to_step}" if data.to_step is not None else ""
            why = f" ({data.reason})" if data.reason else ""
            curve.marks.append(CurveMark(step=data.step, kind="rollback", note=f"rollback{to}{why}"))
        elif isinstance(data, RunPreempted):
            at = data.at_step if data.at_step is not None else step
            note = f"preempted ({data.preemption}/{data.max_preemptions})"
            curve.marks.append(CurveMark(step=at, kind="preemption", note=note))
    return curve


def _ended_at(run: Run) -> float:
    """When the run ended (its last stage's end, else its last change), or now while it runs."""
    if not run.state.is_terminal():
        return time.time()
    ends = [stage.ended for stage in run.stages if stage.ended is not None]
    return max(ends) if ends else run.updated_at
