"""Showing a run: the live view of `fleet run` and following a run to its end (Ctrl-C, SIGTERM and SIGHUP
cancel it first), the worker a command that waits on runs starts when none is up, and one-line renderings
of events for `fleet logs`."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import typer
from rich.console import Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from core.settings import Settings
from fleet.cli_common import err, out
from service import runs as svc
from service.describe import describe, format_value
from state import events
from state.models import Run
from state.payloads import TERMINAL_EVENTS, Event, EventType
from state.stages import RunState, Stage

T = TypeVar("T")  # what a waiting command submitted: a run, a sweep
R = TypeVar("R")  # what it waited for: the run's end, the sweep's view


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


class OwnWorker:
    """The one rule of the commands that wait on runs (`fleet run`, `fleet sweep --wait`): when no worker
    serves every stage queue, the command starts one (with the reaper's beat) and stops it on its way out
    (a context manager). `ready()` waits for it, after the submit, which goes on meanwhile."""

    def __init__(self, fleet: svc.Fleet, settings: Settings) -> None:
        from workers.process import SpawnedWorker, missing_queues

        self.fleet = fleet
        self.spawned = None
        if missing_queues(fleet.redis):
            self.spawned = SpawnedWorker(fleet.redis, fleet.redis_url, settings.home / "logs")

    def ready(self) -> None:
        from workers.process import wait_for_queues

        if self.spawned is not None and not wait_for_queues(self.fleet.redis, 60):
            err.print(f"[red]the worker did not start; see {self.spawned.log_path}[/red]")

    def __enter__(self) -> OwnWorker:
        return self

    def __exit__(self, *_: object) -> None:
        if self.spawned is not None:
            self.spawned.stop()

    def left(self, what: str, state: str) -> None:
        """Say where a run (or sweep) stands that the command leaves before it ended, and what finishes its
        cancel."""
        finish = (
            "the worker this command started has stopped: `fleet up` finishes the cancel and ends its nodes"
            if self.spawned is not None
            else "the fleet's worker finishes the cancel and ends its nodes"
        )
        with contextlib.suppress(OSError):  # the terminal may be gone (SIGHUP)
            err.print(f"left {what} {state} with its cancel requested; {finish}.", markup=False)


def waited(
    fleet: svc.Fleet,
    settings: Settings,
    what: str,
    submit: Callable[[], T],
    cancel: Callable[[T], object],
    wait: Callable[[T], R],
    unfinished: Callable[[T], tuple[str, str] | None],
) -> R:
    """The one rule of the commands that wait on what they submit (`fleet run`, `fleet sweep --wait`): a
    worker of their own when none is up (OwnWorker), signals taken before the submit (cancelling), the first
    cancels and the wait goes on, the second leaves: exit 130, saying where the run or sweep stands
    (`unfinished`: its id and state, None once it ended) and what finishes its cancel."""
    queued: list[T] = []
    worker = None

    def cancel_queued() -> bool:
        if queued:
            cancel(queued[0])
        return bool(queued)

    try:
        with cancelling(cancel_queued, what), OwnWorker(fleet, settings) as worker:
            queued.append(submit())
            worker.ready()
            return wait(queued[0])
    except KeyboardInterrupt:
        if queued and worker is not None and (where := unfinished(queued[0])) is not None:
            worker.left(f"{what} {where[0]}", where[1])
        raise typer.Exit(130) from None


@contextlib.contextmanager
def cancelling(cancel: Callable[[], bool], what: str) -> Iterator[None]:
    """While inside: the first Ctrl-C, SIGTERM or SIGHUP (`timeout`, a closed terminal) calls `cancel` and
    goes on (following `what` to its end); the second gives up (KeyboardInterrupt), and so does the first
    when `cancel` finds nothing to cancel yet (False: the run or sweep is not queued yet). Entered before
    the submit, so that no signal finds the default handler (which would end the command and leave the
    worker it started running)."""
    interrupted = {"n": 0}

    def on_signal(sig: int, _frame: Any) -> None:
        interrupted["n"] += 1
        if interrupted["n"] >= 2 or not cancel():
            raise KeyboardInterrupt
        name = signal.Signals(sig).name
        with contextlib.suppress(OSError):
            err.print(f"[yellow]{name}: cancelling the {what} (again to leave it)...[/yellow]")

    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, on_signal) for sig in stops}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def follow(fleet: svc.Fleet, run: Run, live: bool, quiet: bool) -> Run:
    """Show a run's events until it ends (the caller's `cancelling` says what a signal does meanwhile)."""
    view = LiveView(run)
    with Live(view, console=out, refresh_per_second=4, transient=False) if live else _Null() as screen:
        for event in events.follow_run(fleet.redis, run.run_id, after="0", block_ms=500):
            current = fleet.ledger.get_run(run.run_id)
            view.update(current, event)
            with contextlib.suppress(OSError):  # a closed terminal (SIGHUP) stops the output, not the run
                if screen is not None:
                    screen.refresh()
                elif not quiet:
                    print(describe(event), flush=True)
            if event.type in TERMINAL_EVENTS:
                return current
    return fleet.ledger.get_run(run.run_id)


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None
