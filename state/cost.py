"""What instances and runs cost: each instance's hourly price over the time it has been (or was) up.

The price is the one recorded when the instance was asked for (`Instance.price_per_hour`, the offer's or
the bid's); an instance without one (the local provider's) costs nothing. A live instance counts up to
now; an ended one up to its last change (when it was confirmed gone).
"""

from __future__ import annotations

import time

from state.ledger import Ledger
from state.models import Instance, Run

HOUR_S, DAY_S = 3600.0, 86400.0


def instance_cost(instance: Instance, now: float, since: float = 0.0) -> float:
    """Dollars an instance has cost so far (only the time after `since`, when given)."""
    if instance.price_per_hour is None:
        return 0.0
    end = instance.updated_at if instance.state.is_terminal() else now
    return instance.price_per_hour * max(0.0, end - max(instance.created_at, since)) / HOUR_S


def run_cost(ledger: Ledger, run: Run, now: float | None = None) -> float:
    """Dollars a run's instances have cost so far: every node of every attempt (tf-<run>-1, -2, ...),
    rounded to 0.1 ¢."""
    now = time.time() if now is None else now
    total = 0.0
    for attempt in range(1, run.attempt + 1):
        for name in run.instance_names_of(attempt):
            instance = ledger.get_instance(name)
            if instance is not None:
                total += instance_cost(instance, now)
    return round(total, 3)


def fleet_cost(ledger: Ledger, since: float, now: float | None = None) -> float:
    """Dollars the fleet's instances cost from `since` to now, rounded to 0.1 ¢."""
    now = time.time() if now is None else now
    return round(sum(instance_cost(i, now, since) for i in ledger.list_instances()), 3)
