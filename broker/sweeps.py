"""A sweep's children get their slots here: at most `max_parallel` active at once, the rest wait in order.

`advance` is called whenever a slot may have come free (a child ended, the sweep was just submitted, and on
every reaper pass as a backstop). Under a per-sweep lock it counts the children that are active (not ended,
not waiting), releases waiting ones in order until `max_parallel` are active, and marks the sweep finished
(one `sweep.finished` event carrying the table) once every child has ended. Children only ever leave the
active count by ending, outside the lock, so a count taken under the lock can only be too high: the limit
holds even with many workers calling `advance` at once.
"""

from __future__ import annotations

import logging
import math
import time

from broker.dispatch import Dispatcher
from broker.locks import Lease
from state.keys import sweep_lock_key
from state.ledger import Draft, Ledger
from state.models import Run, Sweep
from state.payloads import Event, RunReleased, SweepFinished, SweepRow
from state.stages import RunState, Stage

log = logging.getLogger("trainfleet.sweeps")

LOCK_TTL_S = 30.0
LOCK_WAIT_S = 2.0  # how long a caller waits for another holder before leaving it to that holder


def advance(ledger: Ledger, dispatcher: Dispatcher, sweep_id: str) -> list[str]:
    """Release waiting children into free slots and finish the sweep when all have ended; returns the run
    ids released. Does nothing (returns []) when another process holds the sweep's lock past LOCK_WAIT_S:
    that holder does the same work."""
    lease = Lease(ledger.client, sweep_lock_key(sweep_id), LOCK_TTL_S)
    if not lease.acquire(LOCK_WAIT_S):
        return []
    try:
        return _advance(ledger, dispatcher, sweep_id)
    finally:
        lease.release()


def _advance(ledger: Ledger, dispatcher: Dispatcher, sweep_id: str) -> list[str]:
    sweep = ledger.get_sweep(sweep_id)
    if sweep.finished_at is not None:
        return []
    runs = ledger.get_runs(sweep.runs)
    children = [runs[r] for r in sweep.runs if r in runs]
    if all(run.state.is_terminal() for run in children):
        _finish(ledger, sweep, children)
        return []
    if sweep.cancel_requested:
        return []
    active = sum(1 for run in children if not run.state.is_terminal() and not run.held)
    released = []
    for run in children:
        if active >= sweep.max_parallel:
            break
        if run.held and not run.state.is_terminal():
            ledger.update_run(run.run_id, _release)
            # A crash right here leaves the run QUEUED, not held and with no owner: the reaper sends it.
            dispatcher.send(Stage.PROVISION, run.run_id, after=None)
            released.append(run.run_id)
            active += 1
    return released


def _release(run: Run) -> list[Draft]:
    if not run.held or run.state.is_terminal():
        return []
    run.held = False
    return [RunReleased(sweep_id=run.sweep_id)]


def _finish(ledger: Ledger, sweep: Sweep, children: list[Run]) -> None:
    rows = table(sweep, children)
    state = sweep_state(sweep, children)

    def finish(s: Sweep) -> Event | None:
        if s.finished_at is not None:
            return None
        s.finished_at = time.time()
        data = SweepFinished(
            sweep_id=s.sweep_id,
            state=state,
            source=s.source,
            metric=s.metric,
            goal=s.goal,
            keys=s.keys,
            rows=rows,
        )
        return Event(id=f"{s.sweep_id}-finished", type=data.type, data=data)

    ledger.update_sweep(sweep.sweep_id, finish)


def sweep_state(sweep: Sweep, children: list[Run]) -> str:
    """RUNNING (or CANCELLING) while a child has not ended; then CANCELLED, SUCCEEDED (every child did) or
    FAILED (some child failed)."""
    if not all(run.state.is_terminal() for run in children):
        return "CANCELLING" if sweep.cancel_requested else "RUNNING"
    if sweep.cancel_requested:
        return "CANCELLED"
    if all(run.state == RunState.SUCCEEDED for run in children):
        return "SUCCEEDED"
    return "FAILED"


def table(sweep: Sweep, children: list[Run]) -> list[SweepRow]:
    """One row per child, in order: its run id, state, the values the sweep set, its final metric (None
    until it has one), and `best` on the one succeeded child with the best metric."""
    rows: list[SweepRow] = []
    for index, run in enumerate(children):
        value = run.metrics.get(sweep.metric)
        number = value if isinstance(value, int | float) and math.isfinite(value) else None
        state = "WAITING" if run.held and not run.state.is_terminal() else run.state.value
        rows.append(
            SweepRow(
                index=index, run_id=run.run_id, state=state, params=run.params, metric=number, best=False
            )
        )
    scored = [r for r in rows if r.metric is not None and r.state == RunState.SUCCEEDED.value]
    if scored:
        pick = min if sweep.goal == "minimize" else max
        pick(scored, key=lambda r: r.metric or 0.0).best = True
    return rows
