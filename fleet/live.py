"""Showing a run: the live view of `fleet run`, and one-line renderings of events for `fleet logs`."""

from __future__ import annotations

import time

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from broker.constants import Stage
from broker.models import Run, RunState
from broker.payloads import Event, EventType
from service.describe import describe, format_value


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
        step, total = progress.step or 0, progress.total_steps or 0
        bar = Table.grid(padding=(0, 2))
        bar.add_row(
            ProgressBar(total=float(total or 1), completed=float(step), width=40),
            Text(
                f"step {step}/{total or '?'}  loss {format_value(progress.loss)}  "
                f"eval_loss {format_value(run.metrics.get('eval_loss'))}"
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
