"""Showing a run: the live view of `fleet run`, and one-line renderings of events for `fleet logs`."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from broker.constants import Stage
from broker.models import Event, EventType, Run, RunState


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


_HEADLINE_METRICS = ("eval_loss_first", "eval_loss", "train_loss", "global_step", "train_runtime_s")


def describe(event: Event) -> str:
    """One line for an event: time, type, and its data as key=value."""
    stamp = datetime.fromtimestamp(event.time, UTC).strftime("%H:%M:%S")
    data = event.data
    if event.type in (EventType.RUN_SUCCEEDED, EventType.TRAIN_FINISHED):
        metrics = data.get("metrics") or {}
        shown = {k: metrics.get(k) for k in _HEADLINE_METRICS if k in metrics}
        data = {"output_dir": data.get("output_dir"), **shown}
    parts = " ".join(f"{k}={_fmt(v)}" for k, v in data.items() if v not in (None, [], {}, ""))
    return f"{stamp} {event.type.value:<22} {parts}".rstrip()


class LiveView:
    """The state `fleet run` draws: stages with timings, a progress bar, the latest losses."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.lines: list[str] = []

    def update(self, run: Run, event: Event | None) -> None:
        self.run = run
        if event is not None and event.type not in (EventType.TRAIN_STEP,):
            self.lines = [*self.lines[-7:], describe(event)]

    def __rich__(self) -> RenderableType:
        """Rendered afresh on every refresh, so the running stage's clock ticks between events."""
        return self.render()

    def render(self) -> RenderableType:
        run = self.run
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        table.add_column("stage")
        table.add_column("status")
        table.add_column("time", justify="right")
        now = time.time()
        for stage in Stage:
            timing = next((t for t in run.stages if t.name == stage), None)
            if timing is None or timing.started is None:
                status, took = Text("waiting", style="dim"), ""
            elif timing.ended is None:
                live = run.state.stage == stage and not run.state.is_terminal()
                status = Text("running" if live else "stopped", style="yellow" if live else "red")
                took = f"{now - timing.started:.1f}s"
            else:
                stopped_here = timing is run.stages[-1] and run.state in (RunState.FAILED, RunState.CANCELLED)
                status = Text("stopped", style="red") if stopped_here else Text("done", style="green")
                took = f"{timing.ended - timing.started:.1f}s"
            table.add_row(stage.value, status, took)
        progress = run.progress
        step, total = progress.get("step") or 0, progress.get("total_steps") or 0
        bar = Table.grid(padding=(0, 2))
        bar.add_row(
            ProgressBar(total=float(total or 1), completed=float(step), width=40),
            Text(
                f"step {step}/{total or '?'}  loss {_fmt(progress.get('loss', '-'))}  "
                f"eval_loss {_fmt(run.metrics.get('eval_loss', '-'))}"
            ),
        )
        head = Text.assemble(
            ("run ", "bold"),
            (run.run_id, "bold cyan"),
            "  ",
            (run.state.value, _state_style(run)),
            f"  provider {run.provider}",
            f"  instance {run.instance or '-'}",
        )
        recent = Text("\n".join(self.lines), style="dim")
        return Group(head, table, bar, recent)


def _state_style(run: Run) -> str:
    return {"SUCCEEDED": "bold green", "FAILED": "bold red", "CANCELLED": "bold yellow"}.get(
        run.state.value, "bold"
    )
