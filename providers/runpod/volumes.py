"""The network volumes the fleet makes on RunPod (`network_volume:`), finds again by name, lists and deletes
(`fleet volumes`), through RunPod's REST API. Only volumes named `tf-...` are the fleet's: one a person
made is never listed or deleted here (a job mounts it by `network_volume_id`).

A volume bills by the month, running pod or not: RunPod's rate is $0.07 per GB per month for the first TB
and $0.05 beyond it (docs.runpod.io, "Network volume billing"), which `monthly_usd` says it costs.
"""

from __future__ import annotations

from core.errors import NodeError, ProvisioningFailed
from jobs.sections import ProviderName
from providers.base import Volume
from providers.runpod.client import RunPodAPIError, RunPodClient
from providers.runpod.models import RunPodVolume
from providers.runpod.section import VOLUME_PREFIX, NetworkVolumeAsk

FIRST_TB_GB = 1000
RATE_FIRST_TB = 0.07  # USD per GB per month
RATE_BEYOND = 0.05


def monthly_usd(size_gb: int) -> float:
    """What a volume of `size_gb` costs a month at RunPod's rates."""
    first = min(size_gb, FIRST_TB_GB)
    return round(first * RATE_FIRST_TB + (size_gb - first) * RATE_BEYOND, 2)


def as_volume(provider: ProviderName, row: RunPodVolume) -> Volume:
    return Volume(provider, row.id, row.name, row.data_center_id, row.size, monthly_usd(row.size))


def ours(client: RunPodClient) -> list[RunPodVolume]:
    """The fleet's volumes on the account (named tf-...), by id."""
    found = [v for v in client.network_volumes() if v.name.startswith(VOLUME_PREFIX)]
    return sorted(found, key=lambda v: v.id)


def find_or_make(client: RunPodClient, ask: NetworkVolumeAsk, max_gb: int) -> tuple[RunPodVolume, bool]:
    """The volume `ask` names in its data center, made when there is none (within `max_gb`): with whether
    it was made now. The caller holds the fleet's lock, so two runs of one name never make two; should
    there be two all the same (one made by hand under the name), every run takes the first by id."""
    found = [v for v in ours(client) if (v.name, v.data_center_id) == (ask.volume_name, ask.data_center)]
    if found:
        return found[0], False
    if ask.size_in_gb > max_gb:
        raise ProvisioningFailed(too_big(ask, max_gb))
    return client.create_network_volume(ask.volume_name, ask.size_in_gb, ask.data_center), True


def too_big(ask: NetworkVolumeAsk, max_gb: int) -> str:
    return (
        f"network_volume: {ask.size_in_gb} GB (${monthly_usd(ask.size_in_gb):.2f}/month) is more than this "
        f"fleet lets a job make ({max_gb} GB, runpod_max_volume_gb)"
    )


def delete(client: RunPodClient, volume_id: str) -> None:
    """Delete the fleet's volume `volume_id` (NodeError: it is not one of the fleet's, or RunPod refuses,
    as it does while a pod mounts it)."""
    if volume_id not in {v.id for v in ours(client)}:
        raise NodeError(f"{volume_id} is not one of the fleet's network volumes (named {VOLUME_PREFIX}...)")
    try:
        client.delete_network_volume(volume_id)
    except RunPodAPIError as exc:
        raise NodeError(f"RunPod did not delete network volume {volume_id}: {exc.message}") from None
