"""The ``ssh:`` section of a job file: machines of one of the operator's pools (providers.ssh.pools),
reached over SSH, claimed whole for the run."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BeforeValidator, Field

from jobs.clouds import Capability
from jobs.sections.base import Lifetime, MachineSection
from jobs.sections.cloud import GpuTypes
from providers.ssh.pools import NAME, Label

Labels = Annotated[tuple[Label, ...], BeforeValidator(lambda v: tuple(v) if isinstance(v, list) else v)]


class SshSection(MachineSection):
    """Machines of one pool. Strict: unknown keys (a rented cloud's, such as `image` or `pod_type`: a pool
    machine runs no container and bills no bid) are errors."""

    MULTI_NODE: ClassVar[Capability] = Capability(True)

    pool: str = Field(
        pattern=NAME,
        description="The pool whose machines the run claims (the fleet's pools file; `fleet pools`).",
    )
    gpu: GpuTypes | None = Field(
        None,
        description="The GPU type, or a list of types any of which will do, in the fleet's names (A100-80GB, "
        "L40S...); unset: any the pool has.",
    )
    gpu_count: int = Field(
        1,
        ge=0,
        le=64,
        description="GPUs the run uses on each machine: one with at least this many is claimed whole, and "
        "Ray is given this many; 0: no GPU (any machine, its CPUs).",
    )
    labels: Labels = Field(
        (), max_length=16, description="Labels every claimed machine must have (the pools file's `labels`)."
    )
    stop_after: Lifetime = Field(
        900,
        description="With one_shot: false, seconds the machine stays claimed (its node up) after the run "
        "before the fleet gives it back to its pool; -1 disables it.",
    )

    def gpu_named(self) -> str:
        if self.gpu_count == 0:
            return "no GPU"
        return " or ".join(self.gpu) if self.gpu else "any GPU"

    def cluster_problems(self) -> list[tuple[str, str]]:
        if self.gpu is not None and self.gpu_count == 0:
            return [("gpu", "names a GPU type, and gpu_count is 0: set gpu_count, or drop gpu")]
        return []
