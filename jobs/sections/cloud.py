"""The ``cloud:`` section of a job file: what the job needs, not where. The run lands on the cheapest offer
that fits on any cloud it allows (every cloud the fleet has, by default), and moves on to the next one when
a create finds no capacity or the node does not come up in time (workers.stages.provision,
providers.anycloud).

Its keys are the rented clouds' shared keys (`RemoteSection`: pod_type, cloud_type, max_bid_per_gpu,
gpu_count, the minimums, stop_after, image, entry, ...), with the same meanings, plus `gpu` in the fleet's
normal names (jobs.gpus; one or a list), `min_gpu_ram_in_gb`, `clouds`, `avoid` and `max_attempts`. For
each cloud and GPU type, `on` writes the cloud's own section, so a rental is made by the same code as a
job's that names that cloud.

`clouds` may also name pools of the operator's own machines (`ssh:lab`: an `owned` provider's name and a
pool's). A pool's free machines that fit are tried before any rental, in the order written, whatever they
cost; `on_machines` writes the owned provider's section for one (its `pool`, the GPU types, the machine
keys). A pool machine runs no container and its pools file says nothing of its vCPUs, memory, disk or
bandwidth, so a job that sets one of those keys (to other than its default) cannot be placed there
(`pool_refusal`); `max_bid_per_gpu` caps a pool machine's `hourly_usd` per GPU asked for as it caps a
rental's price.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BeforeValidator, Field

from jobs import clouds as declared_clouds
from jobs.clouds import Capability, ProviderName, rented_clouds
from jobs.gpus import GPU_TYPES, GpuType, resolve
from jobs.sections.base import MachineSection, RemoteSection, Text

POOL_KEYS: dict[str, str] = {
    "image": "a pool machine runs no container image",
    "private_image": "a pool machine runs no container image",
    "jupyter": "a pool machine runs no Jupyter server",
    "min_vcpu_count": "the pools file does not say a machine's vCPUs",
    "min_memory_in_gb": "the pools file does not say a machine's memory",
    "container_disk_in_gb": "the pools file does not say a machine's disk",
    "min_download": "the pools file does not say a machine's bandwidth",
    "min_upload": "the pools file does not say a machine's bandwidth",
}
"""A `cloud:` section's keys no pool machine can honour, and why: one off its default keeps the pools out."""


def _gpu_types(value: object) -> object:
    """`gpu: A100-80GB` or `gpu: [H100, a100 80gb]`: the GPU types meant, by normal name, in the order
    written, each once."""
    said = [value] if isinstance(value, str) else value
    if not isinstance(said, list | tuple) or not said:
        raise ValueError("must be a GPU type (e.g. A100-80GB) or a non-empty list of them")
    found: dict[str, None] = {}
    for item in said:
        if not isinstance(item, str):
            raise ValueError(f"{item!r} is not a GPU type's name")
        found.update(dict.fromkeys(resolve(item)))
    return tuple(found)


def _clouds(value: object) -> object:
    """`clouds: [ssh:lab, runpod]`: rented clouds by name, and pools as `<owned provider>:<pool>`, in the
    order written, each once."""
    said = [value] if isinstance(value, str) else value
    rented = rented_clouds()
    owners = [name for name, facts in declared_clouds.declared().items() if facts.owned]
    valid = ", ".join([*rented, *(f"{o}:POOL" for o in owners)])
    if not isinstance(said, list | tuple) or not said:
        raise ValueError(f"must be a non-empty list of clouds: {valid}")
    out: list[str] = []
    for item in said:
        if not isinstance(item, str):
            raise ValueError(f"{item!r} is not a cloud's name; valid: {valid}")
        owner, colon, pool = item.partition(":")
        if colon and owner in owners and pool.strip():
            out.append(f"{owner}:{pool.strip()}")
        elif item in owners:
            raise ValueError(f"{item!r} names no pool: write {item}:POOL (a pool of the fleet's pools file)")
        elif item in rented:
            out.append(ProviderName(item))
        else:
            raise ValueError(f"{item!r} is not a cloud that rents GPUs, nor a pool; valid: {valid}")
    return tuple(dict.fromkeys(out))


GpuTypes = Annotated[tuple[str, ...], BeforeValidator(_gpu_types)]
Clouds = Annotated[tuple[str, ...], BeforeValidator(_clouds)]
Avoided = Annotated[tuple[Text, ...], BeforeValidator(lambda v: tuple(v) if isinstance(v, list) else v)]


class CloudSection(RemoteSection):
    """A GPU machine on whichever cloud has the cheapest fitting one. Strict: unknown keys (a vendor's own,
    such as a template id or a host reliability score) are errors: write that vendor's section to use
    them."""

    MULTI_NODE: ClassVar[Capability] = Capability(
        False,
        "a cluster's machines must share one cloud's private network; write the section of a cloud that "
        "joins its machines into one (its own key, not cloud:) to run on several",
    )

    gpu: GpuTypes = Field(
        ("RTX-A5000",),
        description="The GPU type, or a list of types any of which will do, in the fleet's names (A100-80GB, "
        "H100, L40S, RTX-A6000, RTX-4090, ...; `fleet offers` lists them).",
    )
    min_gpu_ram_in_gb: int | None = Field(
        None, ge=1, le=1024, description="At least this much memory per GPU, GB."
    )
    clouds: Clouds = Field(
        default_factory=rented_clouds,
        description="The clouds the run may land on (unset: every cloud that rents, of the fleet's); of "
        "these, those the fleet has credentials for are asked. `ssh:POOL` names a pool of the fleet's own "
        "machines: its free machines that fit are tried first, in the order written.",
    )
    avoid: Avoided = Field(
        (),
        max_length=64,
        description="Locations never to rent in, as the clouds report an offer's (the host's country, e.g. "
        "CN). A cloud whose offers do not say where they are is not asked while `avoid` is set.",
    )
    max_attempts: int = Field(
        3,
        ge=1,
        le=10,
        description="Offers tried before the run fails NO_CAPACITY: a create refused for capacity, or a node "
        "not ready in time, moves the run on to the next cheapest (another GPU type, host or cloud).",
    )

    def gpu_named(self) -> str:
        return " or ".join(self.gpu)

    @property
    def types(self) -> list[GpuType]:
        return [GPU_TYPES[name] for name in self.gpu]

    @property
    def rented(self) -> tuple[ProviderName, ...]:
        """The rented clouds `clouds` allows, in its order."""
        return tuple(ProviderName(c) for c in self.clouds if ":" not in c)

    @property
    def pools(self) -> tuple[tuple[ProviderName, str], ...]:
        """The pools `clouds` names, in its order: (the owned provider, the pool)."""
        found = (c.partition(":") for c in self.clouds if ":" in c)
        return tuple((ProviderName(owner), pool) for owner, _, pool in found)

    def allows(self, provider: str) -> bool:
        """Whether a run of this section may land on `provider` (a rented cloud, or a named pool's)."""
        return provider in self.rented or any(owner == provider for owner, _ in self.pools)

    def pool_refusal(self) -> tuple[str, str] | None:
        """The first key of this section that keeps every pool out, and why (POOL_KEYS; or a
        `min_gpu_ram_in_gb` no GPU type asked for has); None when a pool may run it."""
        fields = type(self).model_fields
        for (
            key,
            why,
        ) in POOL_KEYS.items():  # (not model_fields_set: a section read back from the ledger has all)
            if getattr(self, key) != fields[key].get_default(call_default_factory=True):
                return key, f"{why}: pools ({', '.join(c for c in self.clouds if ':' in c)}) cannot run it"
        if not self._pool_types():
            return "min_gpu_ram_in_gb", f"none of {self.gpu_named()} has {self.min_gpu_ram_in_gb} GB per GPU"
        return None

    def _pool_types(self) -> tuple[str, ...]:
        """The GPU types asked for that have `min_gpu_ram_in_gb` (a pool machine's GPU is known by type)."""
        need = self.min_gpu_ram_in_gb or 0
        return tuple(t.name for t in self.types if t.memory_gb >= need)

    def on_machines(self, owner: ProviderName, offer: str, gpu: str | None = None) -> MachineSection:
        """The owned provider's section for this job on a pool's machine: `offer` names the pool (`lab`) or
        one of its machines (`lab/<machine>`, an offer chosen: its GPU type `gpu`); the machine keys as
        they are, the GPU types those of this section that a pool may give (`pool_refusal`)."""
        facts = declared_clouds.facts(owner)
        if facts is None or not facts.owned:
            raise ValueError(f"{owner} has no pools")
        shared = {key: getattr(self, key) for key in MachineSection.model_fields}
        types = (gpu,) if gpu is not None else self._pool_types()
        return facts.section.model_validate({**shared, "pool": offer.partition("/")[0], "gpu": types})

    def on(
        self, cloud: ProviderName, vendor_gpu: str, secure: bool | None = None, offer: str | None = None
    ) -> MachineSection:
        """The cloud's own section that rents this job's machine on `cloud` with the cloud's GPU `vendor_gpu`
        (on a datacenter host or not, when `secure` says: an offer chosen), the shared keys as they are,
        the cloud's own keys as its section makes them from a choice (`RemoteSection.chosen`). On an owned
        provider, the section of its offer `offer` (`on_machines`)."""
        if offer is not None and (owned := declared_clouds.facts(cloud)) is not None and owned.owned:
            return self.on_machines(cloud, offer, vendor_gpu)
        shared = {key: getattr(self, key) for key in RemoteSection.model_fields}
        if secure is not None:
            shared["cloud_type"] = "SECURE" if secure else "COMMUNITY"
        facts = declared_clouds.facts(cloud)
        if facts is None or not issubclass(facts.section, RemoteSection):
            raise ValueError(f"{cloud} rents no GPU machines")
        if self.avoid and "avoid" in facts.section.model_fields:  # a cloud that keeps out of places itself
            shared["avoid"] = self.avoid
        return facts.section.chosen({**shared, "gpu": vendor_gpu}, self.min_gpu_ram_in_gb)
