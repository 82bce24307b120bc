"""What an hour of a run's nodes may cost at most, where the job's section sets no price cap of its own.

A rented cloud's section has `max_bid_per_gpu`, which caps every offer it takes (state.worstcase). A pool's
machines (`ssh:`) have no bid: each costs its `hourly_usd` in the pools file. So at submit the fleet asks
the pool for every machine that fits (held or free, as `list_offers` gives them) and takes the dearest
`num_nodes` of them: no claim the run can make costs more, as long as the pools file says so. The figure is
kept with the run (`Run.ceiling_per_hour`), so each later check of the caps (admission, the runs that may
still cost) reads the same bound without the pools file. A `local:` job costs nothing.
"""

from __future__ import annotations

from core.errors import FleetError
from jobs.sections import LocalSection, MachineSection, RemoteSection
from jobs.spec import JobSpec
from providers.world import World


def ceiling_per_hour(world: World, spec: JobSpec) -> float | None:
    """The most an hour of a run of `spec` may cost where its section has no price cap (a pool's machines:
    the dearest `num_nodes` that fit); None where it has one (a rented cloud's), or is free (`local:`), or
    the provider cannot say now (the submit's own checks refuse such a job)."""
    section = spec.section
    if isinstance(section, LocalSection | RemoteSection) or not isinstance(section, MachineSection):
        return None
    try:
        prices = sorted(o.price_per_hour for o in world.provider(spec.provider.value).list_offers(section))
    except FleetError:
        return None
    return round(sum(prices[-section.num_nodes :]), 6) if prices else None
