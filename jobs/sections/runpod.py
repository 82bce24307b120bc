"""The ``runpod:`` section of a job file, with the keys and defaults of the proof of concept's section."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, StringConstraints

from jobs.sections.base import AbsolutePath, Capability, RemoteSection, Text, Token, matching

GitUrl = Annotated[
    str,
    StringConstraints(max_length=512),
    matching(r"(https://|git@)[^\s\x00-\x1f\x7f]+", "must be an https:// or git@ URL without spaces"),
]


class RunPodSection(RemoteSection):
    """A RunPod pod. Strict: unknown keys are errors. Shared keys are documented on `RemoteSection`."""

    # The pods of a cluster are created with RunPod's global networking (a private network between the
    # account's pods, each reachable at <pod id>.runpod.internal) and all mount the run's network volume.
    MULTI_NODE: ClassVar[Capability] = Capability(True)

    def multi_node_problems(self) -> list[tuple[str, str]]:
        if self.num_nodes > 1 and self.network_volume_id is None:
            return [
                (
                    "num_nodes",
                    f"a run on {self.num_nodes} RunPod pods needs network_volume_id: a network volume that "
                    "every pod mounts, where the run's checkpoints and results live (one pod cannot reach "
                    "another's disk)",
                )
            ]
        return []

    @property
    def starts_from_template(self) -> bool:
        """Whether the pod runs its template's image and start command (a template, and no `image`): that
        command must run the fleet's start script from the pod's environment ($FLEET_BOOTSTRAP)."""
        return self.template_id is not None and self.image is None

    gpu: Text = Field("NVIDIA RTX A5000", description="RunPod's GPU display name, e.g. 'NVIDIA RTX A5000'.")
    template_id: Token | None = Field(None, description="RunPod template to start the pod from.")
    volume_in_gb: int = Field(200, ge=0, le=10_000, description="Persistent volume in GB; 0 for none.")
    volume_mount_path: AbsolutePath = Field("/content", description="Where the volume is mounted in the pod.")
    network_volume_id: Token | None = Field(
        None,
        description="A RunPod network volume to mount at volume_mount_path instead of a pod volume; runs "
        "keep their files on it. Needed for num_nodes > 1: every pod of the cluster mounts it.",
    )
    axolotl_git: GitUrl | None = Field(
        None, description="Git URL of an axolotl to install (POC compatibility)."
    )
    axolotl_git_branch: Token | None = Field(None, description="Branch of `axolotl_git` to install.")
    axolotl_root: AbsolutePath | None = Field(None, description="Where axolotl is checked out in the pod.")
    prepare_ds_only: bool = Field(False, description="Only tokenize and cache the datasets, then stop.")
