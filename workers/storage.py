"""The storage volume a run's node mounts when its section asks the fleet for one (`network_volume:`), found
or made by the provider (`Provider.volume`) just before the node is created: under a lock of the fleet's,
so two runs of one name never make two volumes, and said in a `volume.ready` event (made or found again,
its size and what it costs a month: it bills until deleted, `fleet volumes --delete`)."""

from __future__ import annotations

from broker.locks import Lease
from core.errors import ProviderUnavailable
from jobs.sections import SectionBase
from providers.base import Provider
from state.models import Run
from state.payloads import VolumeReady
from workers import context

VOLUME_LOCK = "fleet:volume-lock:{provider}"  # one find-or-make at a time per provider
VOLUME_LOCK_S = 120.0  # its TTL, renewed while held: a list and a create, far less
VOLUME_WAIT_S = 30.0  # how long a provision waits for it, then tries again later


def volume_for(
    ctx: context.Context, run: Run, provider: Provider, section: SectionBase, instance: str
) -> str | None:
    """The id of the volume `instance` mounts, found or made now; None: its section asks for none."""
    if not section.asks_volume:
        return None
    lease = Lease(ctx.redis, VOLUME_LOCK.format(provider=provider.name), VOLUME_LOCK_S, renew=True)
    if not lease.acquire(wait_s=VOLUME_WAIT_S):
        raise ProviderUnavailable("another run is finding or making a volume: trying again")
    try:
        found = provider.volume(section)
    finally:
        lease.release()
    if found is None:
        return None
    volume, made = found
    ready = VolumeReady(
        instance=instance,
        volume_id=volume.volume_id,
        name=volume.name,
        where=volume.where,
        size_gb=volume.size_gb,
        monthly_usd=volume.monthly_usd,
        made=made,
    )
    ctx.ledger.update_run(run.run_id, lambda _r: [ready])
    return volume.volume_id
