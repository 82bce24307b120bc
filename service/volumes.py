"""The storage volumes the fleet made for jobs (`network_volume:`), across providers, and deleting one by
hand (`fleet volumes`). The providers' own lists are the truth: a volume bills by the month until deleted,
whether any run uses it or not."""

from __future__ import annotations

from core.errors import NotFound
from providers.base import Volume
from providers.world import World


def fleet_volumes(world: World) -> list[Volume]:
    """Every volume of the fleet's at every provider it has credentials for, by provider and name."""
    found = [v for provider in world.configured() for v in provider.volumes()]
    return sorted(found, key=lambda v: (v.provider.value, v.name, v.where, v.volume_id))


def delete_volume(world: World, volume_id: str) -> Volume:
    """Delete the fleet's volume `volume_id`, and what is on it (NotFound: the fleet has none by that id;
    NodeError: its provider refuses, as RunPod does while a pod mounts it)."""
    for volume in fleet_volumes(world):
        if volume.volume_id == volume_id:
            world.provider(volume.provider.value).delete_volume(volume_id)
            return volume
    raise NotFound(f"no volume of the fleet's has id {volume_id!r} (see `fleet volumes`)")
