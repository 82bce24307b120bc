"""`pod_type: auto`: a run rents spot machines first and goes on on demand, once, when spot fails it.

It leaves spot when a spot create finds no machine (the same node is asked for again at once, on demand),
when a second spot machine stops before it came up (outbid, or its cloud could not start it), or when spot
machines were lost under it more than the section's `max_preemptions` times (the replacement is on demand).
The run records why (`Run.spot_left`, which `Run.node_section` reads), and an `offer.left` event says it.
An INTERRUPTABLE run never leaves spot: past `max_preemptions` it fails INSTANCE_LOST (workers.ending).
"""

from __future__ import annotations

from jobs import clouds
from jobs.sections.base import MachineSection, RemoteSection
from state.ledger import Draft, Ledger
from state.models import Run
from state.payloads import OfferLeft

SPOT = "spot"  # the offer an auto run leaves, as its offer.left event names it


def _renting(run: Run) -> RemoteSection | None:
    """The run's section where its machines are rented; None where they are not (`local:`, a pool's
    machine, which a `cloud:` job may be placed on: nothing bids for it, and nothing preempts it)."""
    section = run.spec.section
    owned = (facts := clouds.facts(run.provider)) is not None and facts.owned
    return section if isinstance(section, RemoteSection) and not owned else None


def on_spot(run: Run) -> bool:
    """Whether the run's machines are rented on spot now (INTERRUPTABLE, or auto before it left spot)."""
    section = _renting(run)
    return section is not None and section.renting(run.spot_left).pod_type == "INTERRUPTABLE"


def max_preemptions(run: Run) -> int | None:
    """How many lost spot machines the run replaces on spot (the section's `max_preemptions`); None when
    its machines are not spot now (on demand: only the fleet's FLEET_MAX_PREEMPTIONS bounds them)."""
    section = _renting(run)
    return section.max_preemptions if section is not None and on_spot(run) else None


def may_leave(run: Run) -> bool:
    """Whether the run is `pod_type: auto` and still on spot: it would go on on demand."""
    section = _renting(run)
    return section is not None and section.pod_type == "auto" and run.spot_left is None


def leave(r: Run, instance: str, why: str) -> list[Draft]:
    """Inside a ledger update: `r` goes on on demand (once), with its offer.left event; [] if it left."""
    if not may_leave(r) or r.state.is_terminal():
        return []
    said = f"{why}; going on on demand (pod_type: auto)"[:300]
    r.spot_left = said
    section = r.node_section(0)
    gpu = section.gpu_named() if isinstance(section, MachineSection) else "?"
    return [OfferLeft(attempt=r.attempt, cloud=r.provider, gpu=gpu, offer=SPOT, why=said, instance=instance)]


def leave_now(ledger: Ledger, run_id: str, instance: str, why: str) -> None:
    """Record `leave` for the run (a spot create found no machine for `instance`)."""
    ledger.update_run(run_id, lambda r: leave(r, instance, why))
