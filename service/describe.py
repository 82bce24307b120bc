"""How a run and its events are shown: one line per event (`fleet logs`, Discord), a run as `fleet status
--json` prints it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from broker.cost import run_cost
from broker.models import Run
from broker.payloads import Event, RunSucceeded, TrainFinished
from service.runs import Fleet


def format_value(value: Any) -> str:
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
    parts = " ".join(f"{k}={format_value(v)}" for k, v in data.items() if v not in (None, [], {}, ""))
    return f"{stamp} {event.type.value:<22} {parts}".rstrip()


def run_view(fleet: Fleet, run: Run) -> dict[str, Any]:
    """A run as `fleet status --json` prints it (with what its instances cost so far)."""
    stages = []
    for timing in run.stages:
        stages.append(
            {
                "name": timing.name.value,
                "started": timing.started,
                "ended": timing.ended,
                "seconds": timing.seconds,
            }
        )
    return {
        "run_id": run.run_id,
        "state": run.state.value,
        "provider": run.provider,
        "source": run.source,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "attempt": run.attempt,
        "preemptions": run.preemptions,
        "instance": run.instance,
        "instances": run.instance_names if run.instance else [],  # a cluster's: the head first
        "stages": stages,
        "output_dir": run.output_dir,
        "failure_reason": run.failure_reason.value if run.failure_reason else None,
        "failure_message": run.failure_message,
        "cancel_requested": run.cancel_requested,
        "sweep_id": run.sweep_id,
        "params": run.params,
        "held": run.held,
        "origin": run.origin.model_dump(mode="json") if run.origin else {},
        "progress": run.progress.model_dump(mode="json"),
        "metrics": {"eval_loss_first": None, "eval_loss": None, **run.metrics},
        "cost_usd": run_cost(fleet.ledger, run),
    }
