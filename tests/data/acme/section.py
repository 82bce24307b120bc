"""The ``acme:`` section of a job file: a throwaway cloud's (tests/unit/test_new_cloud.py)."""

from __future__ import annotations

from pydantic import Field

from jobs.sections.base import RemoteSection, Text


class AcmeSection(RemoteSection):
    """An Acme machine."""

    gpu: Text = Field("acme-a100-80", description="Acme's GPU name.")
    rack: Text = Field("any", description="Acme's own key: the rack to rent in.")

    def gpu_named(self) -> str:
        return self.gpu
