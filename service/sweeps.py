"""Sweeps on the fleet: submit a validated sweep (service/sweep_spec.py reads and expands it), cancel one,
and show one: its view (`fleet status SWEEP --json`) and its table as text.

Each child is an ordinary run (its own node, its own events) that records the sweep and the values it set;
the sweep's slots (at most `max_parallel` children active) are broker/sweeps.py's.
"""

from __future__ import annotations

import secrets
import time

from pydantic import Field

from broker import sweeps as ledger_sweeps
from service import runs
from service.describe import format_value
from service.runs import Fleet
from service.sweep_spec import SweepPlan
from state.cost import run_cost
from state.models import Sweep
from state.payloads import Event, Origin, SweepRow, SweepStarted, SweepSummary

SWEEP_PREFIX = "sw-"


def new_sweep_id() -> str:
    return SWEEP_PREFIX + time.strftime("%y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def submit_sweep(fleet: Fleet, plan: SweepPlan, origin: Origin | None = None) -> Sweep:
    """Record the sweep and every child (all waiting), then release the first `max_parallel`. `origin`:
    who sent it (service.runs.submit), None for the CLI. The children's worst cases are checked against
    the caps together, before anything is written: a sweep that would pass one is refused whole."""
    for job in plan.jobs:
        runs.check_submittable(fleet.world, job, origin)
    runs.check_budget(fleet, plan.jobs, origin)
    run_ids: list[str] = []
    while len(run_ids) < len(plan.jobs):
        if (run_id := runs.new_run_id()) not in run_ids:
            run_ids.append(run_id)
    section = plan.section
    sweep = Sweep(
        sweep_id=new_sweep_id(),
        source=plan.source,
        max_parallel=section.max_parallel,
        metric=section.metric,
        goal=section.goal,
        keys=plan.keys,
        runs=run_ids,
    )
    started = SweepStarted(
        sweep_id=sweep.sweep_id,
        source=sweep.source,
        runs=run_ids,
        keys=sweep.keys,
        max_parallel=sweep.max_parallel,
    )
    event = Event(id=f"{sweep.sweep_id}-started", type=started.type, data=started)
    fleet.ledger.create_sweep(sweep, event)
    for run_id, job, params in zip(run_ids, plan.jobs, plan.params, strict=True):
        runs.submit(
            fleet, job, run_id=run_id, sweep_id=sweep.sweep_id, params=params, held=True, origin=origin
        )
    ledger_sweeps.advance(fleet.ledger, fleet.dispatcher, sweep.sweep_id)
    return fleet.ledger.get_sweep(sweep.sweep_id)


def cancel_sweep(fleet: Fleet, sweep_id: str) -> Sweep:
    """Cancel every child that has not ended (waiting ones never start); the sweep ends CANCELLED."""
    sweep = fleet.ledger.find_sweep(sweep_id)

    def flag(s: Sweep) -> Event | None:
        s.cancel_requested = True
        return None

    sweep = fleet.ledger.update_sweep(sweep.sweep_id, flag)
    for run in fleet.ledger.get_runs(sweep.runs).values():
        if not run.state.is_terminal():
            runs.cancel(fleet, run.run_id)
    ledger_sweeps.advance(fleet.ledger, fleet.dispatcher, sweep.sweep_id)
    return fleet.ledger.get_sweep(sweep.sweep_id)


class SweepView(SweepSummary):
    """A sweep as `fleet status SWEEP --json` prints it: its settings, state, table and cost."""

    created_at: float
    finished_at: float | None
    max_parallel: int
    cancel_requested: bool
    best_run: str | None = Field(serialization_alias="best", description="The best child's run id.")
    cost_usd: float


def sweep_view(fleet: Fleet, sweep: Sweep) -> SweepView:
    """A sweep as `fleet status SWEEP` shows it (`--json`: `model_dump(by_alias=True)`)."""
    runs = fleet.ledger.get_runs(sweep.runs)
    children = [runs[r] for r in sweep.runs if r in runs]
    rows = ledger_sweeps.table(sweep, children)
    best = next((r.run_id for r in rows if r.best), None)
    return SweepView(
        sweep_id=sweep.sweep_id,
        state=ledger_sweeps.sweep_state(sweep, children),
        source=sweep.source,
        created_at=sweep.created_at,
        finished_at=sweep.finished_at,
        max_parallel=sweep.max_parallel,
        metric=sweep.metric,
        goal=sweep.goal,
        keys=sweep.keys,
        cancel_requested=sweep.cancel_requested,
        rows=rows,
        best_run=best,
        cost_usd=round(sum(run_cost(fleet.ledger, run) for run in children), 4),
    )


def table_lines(keys: list[str], rows: list[SweepRow], metric: str) -> list[str]:
    """The sweep's table as fixed-width text (Discord code blocks, plain terminals); the best row starts
    with '*'."""
    header = ["", "run", "state", *keys, metric]
    body = [
        [
            "*" if row.best else "",
            row.run_id,
            row.state,
            *(format_value(row.params.get(k)) for k in keys),
            format_value(row.metric),
        ]
        for row in rows
    ]
    widths = [max(len(cells[i]) for cells in [header, *body]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
        for cells in [header, *body]
    ]
