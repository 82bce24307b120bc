"""`fleet status`: one run (its failure in full, links, time, cost, its losses as sparklines) or the list
of runs (state, time, cost, loss); `fleet plot`: a run's losses as a PNG."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from fleet import cli_watch
from fleet.cli_common import JsonOpt, connect_or_exit, err, find_run_or_exit, out, world_or_exit
from service import runs as svc
from service.describe import RUN_VIEWS, loss_curve, run_detail, run_view, trainer_of
from state.models import Run

BARS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 48


def spark(values: Sequence[float], width: int = SPARK_WIDTH) -> str:
    """`values` as a line of block characters, the lowest ▁ and the highest █; more than `width` values are
    averaged in `width` buckets of consecutive values, so a spike stays where it was."""
    if not values:
        return ""
    if len(values) > width:
        edges = [round(i * len(values) / width) for i in range(width + 1)]
        values = [sum(values[a:b]) / (b - a) for a, b in itertools.pairwise(edges) if b > a]
    low, high = min(values), max(values)
    span = high - low
    top = len(BARS) - 1
    return "".join(BARS[round((v - low) / span * top) if span > 0 else 0] for v in values)


def duration(seconds: float) -> str:
    """1h02m, 3m05s, 42s."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def curve_row(points: Sequence[tuple[int, float]]) -> str:
    """A loss curve as its sparkline, first and last value and the last step."""
    if not points:
        return "-"
    values = [loss for _step, loss in points]
    last_step = points[-1][0]
    return f"{spark(values)}  {values[0]:.4g} -> {values[-1]:.4g} (step {last_step}, {len(points)} points)"


def show_run(fleet: svc.Fleet, run: Run, as_json: bool) -> None:
    view = run_detail(fleet, run)
    if as_json:
        out.print_json(view.model_dump_json())
        return
    table = Table(show_header=False, box=None)
    as_text = view.model_dump(mode="json")
    for key in ("run_id", "state", "provider", "trainer", "source", "instance", "output_dir"):
        table.add_row(key, str(as_text[key]))
    if view.failure_reason is not None:
        table.add_row("failure_reason", view.failure_reason.value)
        table.add_row("failure_message", Text(view.failure_message or ""))  # whole: a traceback's end is why
    if view.origin:
        table.add_row("origin", cli_watch.origin_text(view.origin))
    for placed in view.progress.placements:  # a `cloud:` job's offers, one per attempt
        said = f"{placed.cloud.value} {placed.offer} ({placed.gpu}) ${placed.price_per_hour:.3f}/h"
        table.add_row(
            f"offer {placed.attempt}", Text(said + (f": left, {placed.left}" if placed.left else ""))
        )
    for stage in view.stages:
        took = f"{stage.seconds}s" if stage.seconds is not None else "..."
        table.add_row(f"stage {stage.name.value}", took)
    table.add_row("duration", duration(view.duration_s))
    table.add_row("cost", f"${view.cost_usd:.2f}")
    for key, url in (("wandb", view.wandb_url), ("dashboard", view.dashboard_url)):
        if url:
            table.add_row(key, Text(url))
    table.add_row("eval_loss", f"{view.metrics['eval_loss_first']} -> {view.metrics['eval_loss']}")
    if view.losses is not None:
        table.add_row("train loss", curve_row(view.losses.train))
        table.add_row("eval loss", curve_row(view.losses.eval))
    out.print(table, highlight=False)


def show_runs(fleet: svc.Fleet, runs: list[Run], as_json: bool) -> None:
    if as_json:
        out.print_json(RUN_VIEWS.dump_json([run_view(fleet, r) for r in runs]).decode())
        return
    table = Table()
    table.add_column("run", no_wrap=True, min_width=18)
    for name in ("state", "provider", "trainer", "eval_loss", "time", "cost", "age", "source"):
        table.add_column(name, justify="right" if name in ("eval_loss", "time", "cost", "age") else "left")
    for r in runs:
        view = run_view(fleet, r)
        age = f"{(time.time() - r.created_at) / 60:.0f}m"
        loss = r.metrics.get("eval_loss")
        shown = f"{loss:.4g}" if isinstance(loss, float) else "-"
        state = "WAITING" if r.held and not r.state.is_terminal() else r.state.value  # for a sweep's slot
        source = f"{r.source} ({r.sweep_id})" if r.sweep_id else r.source
        took, cost = duration(view.duration_s), f"${view.cost_usd:.2f}"
        table.add_row(r.run_id, state, r.provider, trainer_of(r), shown, took, cost, age, source)
    out.print(table)


def register(cli: typer.Typer) -> None:
    """Add these commands to the `fleet` app."""
    cli.command()(plot)


def plot(
    run_id: Annotated[str, typer.Argument(help="A run id (or a unique prefix).")],
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="The PNG to write [default: RUN-loss.png here].")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Draw a run's train and eval loss against step (its learning rate on a second axis, its rollbacks and
    preemptions marked) into a PNG; a running run's picture so far."""
    from service import plot as drawing

    fleet = connect_or_exit(world_or_exit(), reading=True)
    run = find_run_or_exit(fleet, run_id)
    curve = loss_curve(fleet.redis, run.run_id)
    if not drawing.has_points(curve):
        err.print(f"run {run.run_id} has reported no loss yet ({run.state.value})", style="red", markup=False)
        raise typer.Exit(1)
    path = output or Path(f"{run.run_id}-loss.png")
    title = f"{run.run_id} ({run.state.value})"
    try:
        path.write_bytes(drawing.png(curve, title))
    except OSError as exc:
        err.print(f"cannot write {path}: {exc.strerror or exc}", style="red", markup=False)
        raise typer.Exit(1) from None
    if as_json:
        points = {"train": len(curve.train), "eval": len(curve.eval), "marks": len(curve.marks)}
        out.print_json(json.dumps({"run_id": run.run_id, "path": str(path.resolve()), "points": points}))
    else:
        out.print(f"{path} ({len(curve.train)} train, {len(curve.eval)} eval points)", highlight=False)
