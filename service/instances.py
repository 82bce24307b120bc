"""What the fleet has rented, across providers, and terminating one by hand (`fleet instances`,
`fleet terminate`). The providers' own lists are the truth; the ledger adds the run each belongs to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.errors import FleetError, NotFound
from providers.base import NodeInstance, Provider
from service.runs import Fleet
from state.events import new_event
from state.models import InstanceState
from state.payloads import InstanceTerminated, InstanceTerminating


class InstanceBusy(FleetError):
    """The instance belongs to a run that is still going; cancel the run instead (or force)."""


@dataclass(frozen=True)
class Row:
    """One live instance of ours, as `fleet instances` shows it."""

    node: NodeInstance
    run_id: str | None
    run_state: str | None

    def view(self) -> dict[str, Any]:
        return {
            "name": self.node.name,
            "provider": self.node.provider.value,
            "provider_id": self.node.provider_id,
            "state": self.node.state.value,
            "age_s": round(self.node.age_s, 1),
            "price_per_hour": self.node.price_per_hour,
            "run_id": self.run_id,
            "run_state": self.run_state,
        }


def _providers(fleet: Fleet) -> list[Provider]:
    return fleet.world.configured()


def live_instances(fleet: Fleet) -> list[Row]:
    """Every live instance of ours at every available provider, oldest first."""
    rows = []
    for provider in _providers(fleet):
        for node in provider.list_instances():
            record = fleet.ledger.get_instance(node.name)
            state = None
            if record is not None:
                try:
                    state = fleet.ledger.get_run(record.run_id).state.value
                except NotFound:
                    state = None
            rows.append(Row(node, record.run_id if record else None, state))
    return sorted(rows, key=lambda r: r.node.created_at)


def find_provider(fleet: Fleet, name: str) -> Provider:
    """The provider that has a live instance of ours by that name."""
    for provider in _providers(fleet):
        if provider.get(name) is not None:
            return provider
    raise NotFound(f"no live instance of ours named {name!r} (see `fleet instances`)")


def terminate(fleet: Fleet, name: str, force: bool = False) -> Row:
    """Terminate one live instance of ours by name; refuses one whose run is still going unless forced."""
    for row in live_instances(fleet):
        if row.node.name != name:
            continue
        if (
            row.run_state is not None
            and row.run_state not in ("SUCCEEDED", "FAILED", "CANCELLED")
            and not force
        ):
            raise InstanceBusy(
                f"{name} belongs to run {row.run_id} ({row.run_state}); "
                f"use `fleet cancel {row.run_id}`, or --force to pull the node from under it"
            )
        provider = next(p for p in _providers(fleet) if p.name == row.node.provider)
        provider.terminate(name)
        gone = provider.gone(name, fresh=True)
        if gone:
            provider.forget(name)
        if fleet.ledger.get_instance(name) is not None:
            state = InstanceState.TERMINATED if gone else InstanceState.TERMINATING
            fleet.ledger.update_instance(name, state=state)
        fleet.ledger.emit(
            new_event(
                (InstanceTerminated if gone else InstanceTerminating)(instance=name, by="user"),
                run_id=row.run_id,
            )
        )
        return row
    raise NotFound(f"no live instance of ours named {name!r} (see `fleet instances`)")
