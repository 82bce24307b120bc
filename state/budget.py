"""The fleet's money against its caps: what was spent in the last 24 h and what the runs not ended may still
cost, for the whole fleet and for each submitter, and why new runs do not fit.

A day cap holds when everything that may still be spent under it, at worst, is within it:

    spent in the last 24 h + what each run not ended may still cost + the new runs' worst cases  <=  cap

What a run may still cost is its worst case (state.worstcase) less what its nodes cost so far, so its
money counts once: first as a promise, then as spent. The fleet's cap (`max_dollars_per_day`) counts every
run; a submitter's (a Discord user's, a watched repository's: PolicySettings.dollars_per_day_of) counts
theirs; and each new run's worst case must be within the per-run cap (`max_dollars_per_run`). A cap already
spent refuses every new run, a free one too, as the fleet always did; a free run is never refused for what
others may cost.

Checked at submit, a sweep, a batch of files or a commit's configs together (all are queued, or none:
service.runs.check_budget), and again when a run leaves the queue (workers.budget.admit), where only the runs
already started count beside it. What was spent is enforced while runs go (workers.budget.enforce).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from core.policy_settings import PolicySettings, Submitter
from state.cost import DAY_S, instance_cost
from state.ledger import Ledger
from state.models import InstanceState, Run
from state.payloads import submitter_of
from state.stages import RunState
from state.worstcase import WorstCase, worst_case

_LIVE = (InstanceState.REQUESTED, InstanceState.STARTING, InstanceState.RUNNING)


@dataclass(frozen=True)
class Ask:
    """A new run against the caps (or one about to leave the queue): who sent it, its worst case, and its
    name for people (its file, or its run id)."""

    who: Submitter
    worst: WorstCase
    source: str


@dataclass
class Held:
    """What is held against the caps now: spent in the last 24 h and still open (what the runs not ended may
    cost yet; math.inf for one that nothing bounds), for the fleet and by submitter (`str(Submitter)`).
    Beside them, what the reaper acts on: the runs not ended, what each run's nodes cost so far (every
    attempt's), and which of those runs have a live priced node (what stopping them saves)."""

    spent: float = 0.0
    open: float = 0.0
    spent_by: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    open_by: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    runs: list[Run] = field(default_factory=list)
    cost: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    spending: set[str] = field(default_factory=set)


def held(
    ledger: Ledger,
    settings: PolicySettings,
    now: float | None = None,
    *,
    started_only: bool = False,
    leave_out: str | None = None,
) -> Held:
    """What the ledger holds against the caps at `now`. `started_only`: count only the runs that left the
    queue (provision's view); `leave_out`: a run not to count (the one being looked at)."""
    now = time.time() if now is None else now
    since = now - DAY_S
    out = Held()
    in_window: dict[str, float] = defaultdict(float)
    for instance in ledger.list_instances():
        window = instance_cost(instance, now, since)
        out.spent += window
        if not instance.run_id:
            continue  # an orphan: the fleet's money, nobody's run
        in_window[instance.run_id] += window
        out.cost[instance.run_id] += instance_cost(instance, now)
        if instance.state in _LIVE and instance.price_per_hour:
            out.spending.add(instance.run_id)
    out.runs = [r for r in ledger.open_runs() if r.run_id != leave_out]
    runs = {r.run_id: r for r in out.runs}
    runs.update(ledger.get_runs([i for i, cost in in_window.items() if cost > 0 and i not in runs]))
    for run_id, cost in in_window.items():
        if run_id in runs:
            out.spent_by[str(submitter_of(runs[run_id].origin))] += cost
    for run in out.runs:
        if started_only and run.state == RunState.QUEUED:
            continue
        worst = worst_case(run.spec, settings.max_dollars_per_run, run.ceiling_per_hour).dollars
        still = max(0.0, worst - out.cost[run.run_id])
        out.open += still
        out.open_by[str(submitter_of(run.origin))] += still
    return out


def refusal(settings: PolicySettings, now_held: Held, asks: Sequence[Ask]) -> str | None:
    """Why `asks`, all together, may not start (one line, with the figures and the setting), or None when
    they fit under every cap."""
    run_cap = settings.max_dollars_per_run
    for ask in asks:
        if run_cap is not None and ask.worst.hours is not None and ask.worst.dollars > run_cap:
            return (
                f"{ask.source} may cost up to {ask.worst.text}; the cap is ${run_cap:.2f} a run "
                "(FLEET_MAX_DOLLARS_PER_RUN): shorten terminate_after, lower max_bid_per_gpu or the GPUs, "
                "or raise the cap"
            )
    if (cap := settings.max_dollars_per_day) is not None:
        why = _over(
            cap, now_held.spent, now_held.open, asks, "the fleet's nodes", "FLEET_MAX_DOLLARS_PER_DAY"
        )
        if why is not None:
            return why
    by_who: dict[str, list[Ask]] = defaultdict(list)
    for ask in asks:
        by_who[str(ask.who)].append(ask)
    for who, theirs in by_who.items():
        found = settings.dollars_per_day_of(theirs[0].who)
        if found is None:
            continue
        cap, name = found
        spent, still = now_held.spent_by.get(who, 0.0), now_held.open_by.get(who, 0.0)
        why = _over(cap, spent, still, theirs, f"the runs of {who}", name)
        if why is not None:
            return why
    return None


def _over(cap: float, spent: float, still: float, asks: Sequence[Ask], whose: str, name: str) -> str | None:
    """Why `asks` do not fit under a day cap of `cap` with `spent` and `still` held (None: they fit)."""
    if spent >= cap:
        return spent_text(whose, spent, cap, name)
    new = sum(ask.worst.dollars for ask in asks)
    total = spent + still + new
    if new <= 0 or total <= cap:
        return None
    if len(asks) == 1:
        what = f"{asks[0].source} may cost up to {asks[0].worst.text}"
    else:
        costliest = max(asks, key=lambda a: a.worst.dollars)
        together = f"${new:,.2f}" if math.isfinite(new) else "without bound"
        what = f"these {len(asks)} runs may cost {together} together (the costliest {costliest.worst.text})"
    held_now = f"${spent:.2f} spent in the last 24 h"
    if still:
        more = f"${still:,.2f}" if math.isfinite(still) else "an unbounded sum"
        held_now += f" and up to {more} more for the runs not ended"
    return f"{what}; with {held_now}, that passes the cap of ${cap:.2f} a day on {whose} ({name})"


def spent_text(whose: str, spent: float, cap: float, name: str) -> str:
    """A day cap spent already, for people: `whose` ("the fleet's nodes") cost `spent` against `cap`."""
    return f"{whose} cost ${spent:.2f} in the last 24 h; the cap is ${cap:.2f} a day ({name})"
