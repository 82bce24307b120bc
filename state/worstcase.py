"""What a run may cost at most: its worst case, known before anything is rented.

Every rented node is asked for within its section's price ceiling, `max_bid_per_gpu` (USD per GPU per
hour: the bid of an INTERRUPTABLE rental, the most an ON_DEMAND one may cost per GPU; providers.offers
leaves out every offer above it). Every section has one (its default is $2, its most $100), so no job on a
rented cloud is without a ceiling, and none needs refusing for want of one. Every node is also ended at
its section's `terminate_after` from its start, whatever else happens (the reaper, and the node's own
failsafe). So a run's worst case is

    the GPUs of its nodes x max_bid_per_gpu x terminate_after

where a node with no GPU (a cluster's CPU head) counts as one: its price is capped as one GPU's. A job on
the local provider costs nothing. A pool's machines (`ssh:`) have no bid: each costs the pools file's
`hourly_usd`, so their hourly bound is the dearest `num_nodes` machines that fit, as priced at submit
(service.pricecap; kept as Run.ceiling_per_hour), and the same lifetimes bound their hours.

A run with `terminate_after: -1` has no deadline. Its bound is then the per-run cap (`max_dollars_per_run`,
on by default), which the stages and the reaper enforce while it goes; a node it leaves behind
(`one_shot: false`) adds its hours at the ceiling: the day a failed run's node is kept, or the section's
`stop_after` once idle. With the per-run cap off, or a node idle for ever (`stop_after: -1`), nothing
bounds it: the worst case is infinite, and any day cap refuses it.

The bound is an attempt's: a node replaced after a preemption has a deadline of its own. What all of a
run's nodes cost together is held by the per-run cap, which a bounded run's worst case may not pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jobs.sections.base import MachineSection, RemoteSection
from jobs.spec import JobSpec

HOUR_S = 3600.0
KEEP_MAX_S = 24 * 3600  # the longest a failed run's node is kept for debugging (workers.ending)


@dataclass(frozen=True)
class WorstCase:
    """The most a run may cost (`dollars`; math.inf: nothing bounds it), its nodes' hourly price at their
    ceiling, the hours they may live (None: no deadline), and how it was reckoned, for people."""

    dollars: float
    per_hour: float
    hours: float | None
    how: str

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.dollars)

    @property
    def text(self) -> str:
        """`$48.00 (1 node x 1 GPU x $2.00/GPU/h (max_bid_per_gpu) x 24 h (terminate_after))`."""
        figure = f"${self.dollars:,.2f}" if self.bounded else "no bound"
        return f"{figure} ({self.how})"


FREE = WorstCase(0.0, 0.0, None, "the local provider: this machine costs nothing")


def worst_case(spec: JobSpec, run_cap: float | None, ceiling: float | None = None) -> WorstCase:
    """The worst case of a run of `spec` under the per-run cap `run_cap` (None: no cap); see the module's
    notes. `ceiling`: the most an hour of its nodes may cost where the section has no `max_bid_per_gpu` (a
    pool's machines: service.pricecap, kept as Run.ceiling_per_hour)."""
    section = spec.section
    if isinstance(section, MachineSection) and not isinstance(section, RemoteSection) and ceiling is not None:
        nodes_said = f"{section.num_nodes} node{'s' if section.num_nodes > 1 else ''}"
        hourly = f"{nodes_said} at ${ceiling:.2f}/h at most (the dearest pool machines that fit: hourly_usd)"
        return _bounded(spec, section, ceiling, hourly, run_cap)
    if not isinstance(section, RemoteSection):
        return FREE
    nodes = [section.node_section(k) for k in range(section.num_nodes)]
    gpus = [max(n.gpu_count, 1) for n in nodes]
    per_hour = round(sum(g * n.max_bid_per_gpu for g, n in zip(gpus, nodes, strict=True)), 6)
    bids = {n.max_bid_per_gpu for n in nodes}
    price = f"${min(bids):.2f}/GPU/h" if len(bids) == 1 else f"${min(bids):.2f}-{max(bids):.2f}/GPU/h"
    shape = (
        f"{len(nodes)} node{'s' if len(nodes) > 1 else ''} x {gpus[0]} GPU{'s' if gpus[0] > 1 else ''}"
        if len(set(gpus)) == 1
        else f"{sum(gpus)} GPUs on {len(nodes)} nodes"
    )
    hourly = f"{shape} x {price} (max_bid_per_gpu)"
    return _bounded(spec, section, per_hour, hourly, run_cap)


def _bounded(
    spec: JobSpec, section: MachineSection, per_hour: float, hourly: str, run_cap: float | None
) -> WorstCase:
    """The worst case of nodes costing `per_hour` (said as `hourly`) for the section's lifetimes."""
    if section.terminate_after != -1:
        hours = section.terminate_after / HOUR_S
        how = f"{hourly} x {hours:g} h (terminate_after)"
        return WorstCase(round(per_hour * hours, 3), per_hour, hours, how)
    if run_cap is None:
        why = "terminate_after: -1 and no per-run cap (FLEET_MAX_DOLLARS_PER_RUN): nothing ends its nodes"
        return WorstCase(math.inf, per_hour, None, why)
    capped = f"terminate_after: -1: the per-run cap, ${run_cap:.2f} (FLEET_MAX_DOLLARS_PER_RUN)"
    if spec.one_shot:
        return WorstCase(run_cap, per_hour, None, capped)
    stop_after = section.stop_after
    if stop_after == -1:
        why = "terminate_after: -1 and one_shot: false with stop_after: -1: its node may idle for ever"
        return WorstCase(math.inf, per_hour, None, why)
    left_h = max(KEEP_MAX_S, stop_after) / HOUR_S
    left = f" + its node left {left_h:g} h after the run (one_shot: false) at {hourly}"
    return WorstCase(round(run_cap + per_hour * left_h, 3), per_hour, None, capped + left)
