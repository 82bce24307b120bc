"""The ``local:`` section of a job file: train on this machine with a local Ray cluster."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from jobs.clouds import Capability
from jobs.sections.base import SectionBase


class LocalSection(SectionBase):
    """Run on the machine the fleet runs on. Strict: unknown keys are errors."""

    MULTI_NODE: ClassVar[Capability] = Capability(
        False,
        "the local provider starts one Ray node on this machine",
    )

    num_cpus: int | None = Field(
        None, ge=1, le=1024, description="CPUs the local Ray node may use; unset means all the machine has."
    )
    num_gpus: int = Field(0, ge=0, le=64, description="GPUs the local Ray node may use.")
