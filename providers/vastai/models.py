"""vast.ai's records as the adapter reads them: an offer (a search result) and an instance (a listing row).

Only the fields the fleet reads are named; vast.ai sends many more, and adds some, so the rest is ignored.
vast.ai omits fields or sends them as null, so every field has the default the adapter expects. A field in
`Number` is a number only when vast.ai sends one: null, a string or a bool reads as unknown (None).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict


def _number_or_none(value: object) -> object:
    """An int or float as sent; anything else (null, a string, a bool) is unknown."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return None


Number = Annotated[int | float | None, BeforeValidator(_number_or_none)]
"""A numeric field of vast.ai's, or None when it is missing or not a number (ints stay ints)."""


def first_number(*values: float | None) -> float | None:
    """The first of `values` that is known, as a float (e.g. `reliability2`, else `reliability`)."""
    for value in values:
        if value is not None:
            return float(value)
    return None


class VastRecord(BaseModel):
    """What every vast.ai record model shares: extra fields ignored, read-only."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class VastOffer(VastRecord):
    """One offer of `search_offers` (a machine's GPUs for rent). In a bid search `dph_total` is the
    machine's minimum bid; `min_bid` is that everywhere. `cpu_ram` and `gpu_ram` are in MB."""

    id: int | None = None
    gpu_name: str | None = ""
    num_gpus: int | None = None
    dph_total: Number = None
    min_bid: Number = None
    gpu_ram: Number = None
    cpu_ram: Number = None
    cpu_cores_effective: Number = None
    inet_down: Number = None
    inet_up: Number = None
    disk_space: Number = None
    reliability2: Number = None
    reliability: Number = None
    cuda_max_good: Number = None
    verified: bool | None = None
    datacenter: bool | None = None
    hosting_type: Number = None
    """1 for a datacenter host."""
    geolocation: str | None = ""

    def shown_reliability(self) -> float | None:
        """The reliability shown: `reliability2` when vast.ai sends it (even as null), else `reliability`."""
        return self.reliability2 if "reliability2" in self.model_fields_set else self.reliability


class VastPortBinding(VastRecord):
    """Where a container port is published on the host (Docker's shape)."""

    model_config = ConfigDict(coerce_numbers_to_str=True)

    HostIp: str | None = None
    HostPort: str | None = None


class VastInstance(VastRecord):
    """One row of `show_instances`: an instance of the account. `ports` maps a container port
    ("8265/tcp") to its host bindings, once the container runs. An instance launched with SSH has
    `ssh_host`/`ssh_port` (vast.ai's SSH proxy) and, with direct SSH, a "22/tcp" binding."""

    id: int
    label: str | None = None
    actual_status: str | None = None
    intended_status: str | None = None
    status_msg: str | None = None
    dph_total: Number = None
    gpu_util: Number = None
    start_date: Number = None
    uptime_mins: Number = None
    public_ipaddr: str | None = None
    ports: dict[str, list[VastPortBinding | None] | None] | None = None
    ssh_host: str | None = None
    ssh_port: Number = None
