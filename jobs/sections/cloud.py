"""The ``cloud:`` section of a job file: what the job needs, not where. The run lands on the cheapest offer
that fits on any cloud it allows (every cloud the fleet has, by default), and moves on to the next one when
a create finds no capacity or the node does not come up in time (workers.stages.provision,
providers.anycloud).

Its keys are the rented clouds' shared keys (`RemoteSection`: pod_type, cloud_type, max_bid_per_gpu,
gpu_count, the minimums, stop_after, image, entry, ...), with the same meanings, plus `gpu` in the fleet's
normal names (jobs.gpus; one or a list), `min_gpu_ram_in_gb`, `clouds`, `avoid` and `max_attempts`. For
each cloud and GPU type, `on` writes the cloud's own section, so a rental is made by the same code as a
job's that names that cloud.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BeforeValidator, Field

from jobs import clouds as declared_clouds
from jobs.clouds import Capability, ProviderName, rented_clouds
from jobs.gpus import GPU_TYPES, GpuType, resolve
from jobs.sections.base import RemoteSection, Text


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
    said = [value] if isinstance(value, str) else value
    rented = rented_clouds()
    if not isinstance(said, list | tuple) or not said:
        raise ValueError(f"must be a non-empty list of clouds: {', '.join(rented)}")
    out = []
    for item in said:
        if item not in rented:
            raise ValueError(f"{item!r} is not a cloud that rents GPUs; valid: {', '.join(rented)}")
        out.append(ProviderName(item))
    return tuple(dict.fromkeys(out))


GpuTypes = Annotated[tuple[str, ...], BeforeValidator(_gpu_types)]
Clouds = Annotated[tuple[ProviderName, ...], BeforeValidator(_clouds)]
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
        description="The clouds the run may land on (unset: every cloud the fleet has); of these, those "
        "the fleet has credentials for are asked.",
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

    def on(self, cloud: ProviderName, vendor_gpu: str, secure: bool | None = None) -> RemoteSection:
        """The cloud's own section that rents this job's machine on `cloud` with the cloud's GPU `vendor_gpu`
        (on a datacenter host or not, when `secure` says: an offer chosen), the shared keys as they are,
        the cloud's own keys as its section makes them from a choice (`RemoteSection.chosen`)."""
        shared = {key: getattr(self, key) for key in RemoteSection.model_fields}
        if secure is not None:
            shared["cloud_type"] = "SECURE" if secure else "COMMUNITY"
        facts = declared_clouds.facts(cloud)
        if facts is None or not issubclass(facts.section, RemoteSection):
            raise ValueError(f"{cloud} rents no GPU machines")
        if self.avoid and "avoid" in facts.section.model_fields:  # a cloud that keeps out of places itself
            shared["avoid"] = self.avoid
        return facts.section.chosen({**shared, "gpu": vendor_gpu}, self.min_gpu_ram_in_gb)
