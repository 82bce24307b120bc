"""The head's own shape in a cluster: `head:` under a provider section that joins several machines.

A cluster's node 0 runs the Ray head; the others join it. By default every node is rented with the
section's keys. `head:` rents node 0 with other values for the keys that say what a machine is (its GPU
type and count, vCPUs, memory, disk); a key it leaves out is the section's. `num_nodes` still counts every
machine, the head included: `num_nodes: 3` with `head:` is one head and two nodes of the section's shape.

Where the workers train is the job's `resources_per_worker`: with `accelerator_type:<GPU>` (the custom
resource Ray gives a node with that GPU) they are placed only on the nodes with that GPU (jobs.topology).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from jobs.sections.base import Text


class HeadShape(BaseModel):
    """Node 0's keys where they differ from the section's. Strict: unknown keys are errors."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)

    gpu: Text | None = Field(
        None, description="The head's GPU type, in the provider's names; unset: the section's."
    )
    gpu_count: int | None = Field(
        None,
        ge=0,
        le=16,
        description="GPUs on the head; 0 for a CPU-only head where the provider can join one to a cluster; "
        "unset: the section's.",
    )
    min_vcpu_count: int | None = Field(
        None, ge=1, le=512, description="At least this many vCPUs on the head."
    )
    min_memory_in_gb: int | None = Field(
        None, ge=1, le=4096, description="At least this much system memory on the head, GB."
    )
    container_disk_in_gb: int | None = Field(
        None, ge=10, le=2048, description="The head's container disk, GB."
    )

    def updates(self) -> dict[str, Any]:
        """The keys this shape sets, for the section's copy that rents the head."""
        return {key: value for key, value in self.model_dump().items() if value is not None}
