"""`fleet sweep`: one job file, many runs; and the sweep's table for `fleet status SWEEP`."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.table import Table

from core.errors import ConfigError, FleetError
from fleet import live
from fleet.cli_common import JsonOpt, connect_or_exit, err, out, world_or_exit
from jobs.spec import format_problems
from service import sweep_load, sweep_spec, sweeps
from service.describe import format_value
from service.runs import Fleet
from service.sweeps import SweepView
from state.models import Sweep

FINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")


def register(cli: typer.Typer) -> None:
    """Add `fleet sweep` to the `fleet` app."""
    cli.command()(sweep)


def sweep(
    file: Annotated[Path, typer.Argument(help="A job YAML (its `sweep:` unless SWEEPFILE).")],
    sweep_file: Annotated[
        Path | None,
        typer.Argument(metavar="SWEEPFILE", help="A sweep file in axolotl's --sweep format."),
    ] = None,
    max_parallel: Annotated[
        int | None, typer.Option(min=1, max=sweep_spec.MAX_PARALLEL, help="Children active at once.")
    ] = None,
    wait: Annotated[bool, typer.Option(help="Show the table live until the sweep ends.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Queue a sweep: one run per combination of values, at most --max-parallel at once.

    Every child is validated before anything is queued. `fleet status SWEEP` shows the table of parameters
    against the final metric (the best run marked); `fleet cancel SWEEP` cancels every child."""
    world = world_or_exit()
    settings = world.settings
    try:
        plan = sweep_load.load_sweep(
            file,
            sweep_file,
            default_provider=settings.default_provider,
            max_parallel=max_parallel,
            data_roots=settings.data_roots,
        )
    except ConfigError as exc:
        err.print(format_problems(exc), markup=False, highlight=False)
        raise typer.Exit(1) from None
    for warning in plan.warnings:
        err.print(f"[yellow]warning[/yellow] {plan.source}: {warning}", highlight=False)
    fleet = connect_or_exit(world)
    if not wait:
        _queued(fleet, _submit(fleet, plan), as_json)
        return
    # --wait: the rule of every command that waits on runs (as `fleet run`): live.waited.

    def unfinished(sweep: Sweep) -> tuple[str, str] | None:
        state = sweeps.sweep_view(fleet, fleet.ledger.get_sweep(sweep.sweep_id)).state
        return None if state in FINAL_STATES else (sweep.sweep_id, state)

    view = live.waited(
        fleet,
        settings,
        "sweep",
        submit=lambda: _submit(fleet, plan),
        cancel=lambda sweep: sweeps.cancel_sweep(fleet, sweep.sweep_id),
        wait=lambda sweep: follow(fleet, sweep.sweep_id, live=not as_json and out.is_terminal),
        unfinished=unfinished,
    )
    if as_json:
        out.print_json(view.model_dump_json(by_alias=True))
    else:
        show(view)
    raise typer.Exit(0 if view.state == "SUCCEEDED" else 1)


def _submit(fleet: Fleet, plan: sweep_spec.SweepPlan) -> Sweep:
    try:
        return sweeps.submit_sweep(fleet, plan)
    except ConfigError as exc:
        err.print(format_problems(exc), markup=False, highlight=False)
        raise typer.Exit(1) from None


def _queued(fleet: Fleet, found: Sweep, as_json: bool) -> None:
    """A sweep queued without --wait: what was queued, and a word when no worker serves its queues."""
    from workers.process import missing_queues

    if missing := missing_queues(fleet.redis):
        err.print(
            f"[yellow]no worker serves {', '.join(missing)} yet: start `fleet up` or `fleet worker`[/yellow]"
        )
    if as_json:
        out.print_json(sweeps.sweep_view(fleet, found).model_dump_json(by_alias=True))
        return
    line = f"{found.sweep_id}: {len(found.runs)} runs, at most {found.max_parallel} at once"
    out.print(line, highlight=False)
    for run_id in found.runs:
        print(run_id)


def follow(fleet: Fleet, sweep_id: str, live: bool, every_s: float = 2.0) -> SweepView:
    """Poll the sweep until it ends (a live table on a terminal); returns its final view."""
    view = sweeps.sweep_view(fleet, fleet.ledger.get_sweep(sweep_id))
    if not live:
        while view.state not in FINAL_STATES:
            time.sleep(every_s)
            view = sweeps.sweep_view(fleet, fleet.ledger.get_sweep(sweep_id))
        return view
    with Live(render(view), console=out, refresh_per_second=2) as screen:
        while view.state not in FINAL_STATES:
            time.sleep(every_s)
            view = sweeps.sweep_view(fleet, fleet.ledger.get_sweep(sweep_id))
            screen.update(render(view))
    return view


def status(fleet: Fleet, sweep_id: str, as_json: bool) -> None:
    """`fleet status SWEEP`: the table."""
    _print(fleet, lambda: fleet.ledger.find_sweep(sweep_id), as_json, brief=False)


def cancel(fleet: Fleet, sweep_id: str, as_json: bool) -> None:
    """`fleet cancel SWEEP`: every child that has not ended is cancelled (waiting ones never start)."""
    _print(fleet, lambda: sweeps.cancel_sweep(fleet, sweep_id), as_json, brief=True)


def _print(fleet: Fleet, get: Callable[[], Sweep], as_json: bool, brief: bool) -> None:
    try:
        found = get()
    except FleetError as exc:
        err.print(str(exc), style="red", markup=False, highlight=False)
        raise typer.Exit(1) from None
    view = sweeps.sweep_view(fleet, found)
    if as_json:
        out.print_json(view.model_dump_json(by_alias=True))
    elif brief:
        out.print(f"{found.sweep_id} {view.state}", highlight=False)
    else:
        show(view)


def show(view: SweepView) -> None:
    out.print(render(view))
    out.print(
        f"{view.sweep_id} {view.state} · best {view.best_run or '-'} ({view.goal} {view.metric}) · "
        f"cost ${view.cost_usd:.2f}",
        highlight=False,
    )


def render(view: SweepView) -> Table:
    """The sweep's table: one row per child, its values and its final metric; the best row marked."""
    title = f"sweep {view.sweep_id} · {view.state} · {view.source}"
    table = Table(title=title, title_justify="left")
    table.add_column("", no_wrap=True)
    table.add_column("run", no_wrap=True, min_width=18)
    table.add_column("state")
    for key in view.keys:
        table.add_column(key, justify="right")
    table.add_column(view.metric, justify="right")
    for row in view.rows:
        values = [format_value(row.params.get(k)) for k in view.keys]
        table.add_row(
            "★ best" if row.best else "",
            row.run_id,
            row.state,
            *values,
            format_value(row.metric),
            style="bold green" if row.best else None,
        )
    return table
