"""The ``vastai:`` section of a job file: the RunPod keys that vast.ai has, with the same meanings."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from jobs.clouds import Capability
from jobs.sections.base import RemoteSection, Text


class VastAISection(RemoteSection):
    """A vast.ai instance. Strict: unknown keys (including RunPod-only ones such as ``volume_in_gb``) are
    errors. ``pod_type`` INTERRUPTABLE rents by bid; ``cloud_type`` SECURE means datacenter hosts only.
    """

    MULTI_NODE: ClassVar[Capability] = Capability(
        False,
        "vast.ai rents single hosts that share no private network (each instance is reachable only through "
        "its own mapped ports), so its machines cannot form one Ray cluster",
    )

    @classmethod
    def chosen(cls, shared: dict[str, object], min_gpu_ram_in_gb: int | None) -> VastAISection:
        return cls.model_validate({**shared, "min_gpu_ram_in_gb": min_gpu_ram_in_gb})

    def gpu_named(self) -> str:
        return self.gpu

    gpu: Text = Field(
        "RTX_A5000", description="vast.ai's GPU name, e.g. 'RTX_A6000' ('RTX A6000' means the same)."
    )
    min_reliability: float = Field(
        0.95, ge=0.0, le=1.0, description="Lowest host reliability score vast.ai reports (0..1)."
    )
    min_gpu_ram_in_gb: int | None = Field(
        None, ge=1, le=1024, description="At least this much memory per GPU, GB."
    )
    min_cuda_version: float | None = Field(
        None, ge=10.0, le=99.0, description="Lowest CUDA version the host driver supports, e.g. 12.1."
    )
    verified_only: bool = Field(True, description="Only hosts vast.ai has verified.")
