"""The ``runpod:`` section of a job file, with the keys and defaults of the proof of concept's section."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, StringConstraints

from providers.sections import AbsolutePath, Capability, RemoteSection, Text, Token, matching

GitUrl = Annotated[
    str,
    StringConstraints(max_length=512),
    matching(r"(https://|git@)[^\s\x00-\x1f\x7f]+", "must be an https:// or git@ URL without spaces"),
]


class RunPodSection(RemoteSection):
    """A RunPod pod. Strict: unknown keys are errors. Shared keys are documented on `RemoteSection`."""

    MULTI_NODE: ClassVar[Capability] = Capability(
        False,
        "a run on several RunPod machines needs pods on one private network (RunPod's global networking "
        "or its Instant Clusters), which trainfleet does not ask for yet",
    )

    gpu: Text = Field("NVIDIA RTX A5000", description="RunPod's GPU display name, e.g. 'NVIDIA RTX A5000'.")
    template_id: Token | None = Field(None, description="RunPod template to start the pod from.")
    volume_in_gb: int = Field(200, ge=0, le=10_000, description="Persistent volume in GB; 0 for none.")
    volume_mount_path: AbsolutePath = Field("/content", description="Where the volume is mounted in the pod.")
    axolotl_git: GitUrl | None = Field(
        None, description="Git URL of an axolotl to install (POC compatibility)."
    )
    axolotl_git_branch: Token | None = Field(None, description="Branch of `axolotl_git` to install.")
    axolotl_root: AbsolutePath | None = Field(None, description="Where axolotl is checked out in the pod.")
    prepare_ds_only: bool = Field(False, description="Only tokenize and cache the datasets, then stop.")
