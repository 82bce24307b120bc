"""The operator's pools as the fleet holds them (`fleet pools`): each machine, its GPUs and price, and the
run that holds it, since when, and whether its node is up."""

from __future__ import annotations

import time
from dataclasses import dataclass

from core.errors import ProvisioningFailed
from providers.ssh.provider import SshProvider
from providers.world import World


@dataclass(frozen=True)
class PoolRow:
    """One machine of a pool, and who holds it."""

    pool: str
    machine: str
    user: str
    gpus: int
    gpu: str | None
    labels: tuple[str, ...]
    hourly_usd: float
    run_id: str | None = None
    instance: str | None = None
    held_s: float | None = None
    node_up: bool = False


def pool_rows(world: World) -> list[PoolRow]:
    """Every machine of every pool (ProvisioningFailed: the fleet has no pools, or their file is not
    valid, or this world has no Redis to read the claims from)."""
    provider = world.provider("ssh")
    if not isinstance(provider, SshProvider):
        raise ProvisioningFailed("this fleet has no ssh provider")
    now = time.time()
    return [
        PoolRow(
            machine.pool,
            machine.name,
            machine.user,
            machine.gpus,
            machine.gpu,
            machine.labels,
            machine.hourly_usd,
            claim.run_id if claim else None,
            claim.instance if claim else None,
            claim.held_s(now) if claim else None,
            claim is not None and claim.node is not None,
        )
        for machine, claim in provider.holdings()
    ]
