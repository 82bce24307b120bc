"""The ``runpod:`` section of a job file, with the keys and defaults of the proof of concept's section."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from jobs.clouds import Capability
from jobs.sections.base import AbsolutePath, RemoteSection, Text, Token, matching
from jobs.sections.cloud import Avoided
from jobs.sections.head import HeadShape

# Ray's pattern for an NVIDIA GPU's model token in its name (ray/_private/accelerators/nvidia_gpu.py)
_RAY_GPU_NAME = re.compile(r"\w+\s+((?:[A-Z]+\s+)*[A-Z0-9]*\d[A-Z0-9]*)")

# RunPod's data center ids: US-GA-1, EU-RO-1, EUR-IS-1, CA-MTL-1 (its `dataCenters` query lists them)
DataCenterId = Annotated[
    str,
    StringConstraints(max_length=16),
    matching(r"[A-Z]{2,4}-[A-Z]{2,4}-\d{1,3}", "must be a RunPod data center id, such as EU-RO-1 or US-GA-1"),
]
DataCenters = Annotated[
    tuple[DataCenterId, ...],
    BeforeValidator(lambda v: (v,) if isinstance(v, str) else tuple(v) if isinstance(v, list) else v),
]

VOLUME_PREFIX = "tf-"
"""The fleet's network volumes are called `tf-<name>`: `fleet volumes` lists and deletes only those."""


class NetworkVolumeAsk(BaseModel):
    """A network volume the fleet makes, or finds, for the job: `tf-<name>` in `data_center`."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    name: Annotated[
        str,
        StringConstraints(max_length=40),
        matching(r"[a-z0-9][a-z0-9-]*", "must be lower-case letters, digits and -"),
    ] = Field(
        "trainfleet",
        description="The volume's name (RunPod's is tf-<name>): later runs that name it in the same data "
        "center use the same volume, and find what earlier runs left there (the model cache, prepared "
        "datasets, their runs' files).",
    )
    size_in_gb: int = Field(
        ge=10,
        le=4000,
        description="Its size when the fleet makes it, GB (at most the fleet's runpod_max_volume_gb); one "
        "already there is used at its own size. Billed by the month until deleted (`fleet volumes`).",
    )
    data_center: DataCenterId = Field(
        description="The data center it is in: RunPod puts the job's pods there, beside it."
    )

    @property
    def volume_name(self) -> str:
        return VOLUME_PREFIX + self.name


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
    CPU_HEAD: ClassVar[Capability] = Capability(
        False,
        "RunPod's global networking, which joins a cluster's pods on one private network, is for NVIDIA GPU "
        "pods only, so a CPU pod could not reach the other nodes",
    )
    """Whether the head may be a CPU-only machine (`head: {gpu_count: 0}`)."""

    @property
    def volume(self) -> str | None:
        """The network volume's key in the section (`network_volume_id` or `network_volume`), if any."""
        if self.network_volume_id is not None:
            return "network_volume_id"
        return "network_volume" if self.network_volume is not None else None

    @property
    def asks_volume(self) -> bool:
        return self.network_volume is not None

    def cluster_problems(self) -> list[tuple[str, str]]:
        problems = []
        if self.network_volume_id is not None and self.network_volume is not None:
            message = "names a volume, and network_volume asks the fleet for one: keep one of them"
            problems.append(("network_volume_id", message))
        if self.volume is not None and (self.data_center or self.avoid):
            key = "data_center" if self.data_center else "avoid"
            problems.append(
                (
                    key,
                    "chooses where the pod goes, but a network volume's pods go where the volume is (RunPod "
                    "places them in its data center): drop it, or use a volume in the data center you want",
                )
            )
        if self.num_nodes > 1 and self.volume is None:
            problems.append(
                (
                    "num_nodes",
                    f"a run on {self.num_nodes} RunPod pods needs network_volume_id (or network_volume: the "
                    "fleet makes one): a network volume that every pod mounts, where the run's checkpoints "
                    "and results live (one pod cannot reach another's disk)",
                )
            )
        if self.head is not None and self.num_nodes < 2:
            message = (
                "gives the head of a cluster its own shape, and num_nodes: 1 is no cluster: set num_nodes "
                "to the head and the nodes of the section's shape (e.g. 3 for the head and two more), or "
                "write these keys in the section itself"
            )
            problems.append(("head", message))
        if self.head is not None and self.head.gpu_count == 0 and not self.CPU_HEAD.supported:
            message = (
                f"a CPU-only head cannot be part of a RunPod cluster: {self.CPU_HEAD.reason}. Give the head "
                "a GPU (a small one will do, e.g. gpu: NVIDIA RTX A4000 and gpu_count: 1) and keep the "
                "workers off it with accelerator_type:<the others' GPU> in resources_per_worker"
            )
            problems.append(("head.gpu_count", message))
        return problems

    @property
    def has_own_head(self) -> bool:
        return self.head is not None

    def node_section(self, node: int) -> RunPodSection:
        if node == 0 and self.head is not None:
            return self.model_copy(update={**self.head.updates(), "head": None})
        return self

    @staticmethod
    def accelerator_type(gpu: str) -> str:
        """What Ray calls a node with this GPU, `accelerator_type:<this>`: RunPod's GPU ids are the names
        NVIDIA's driver reports, which Ray turns into the type by its own rule (Ray 2.60's
        NvidiaGPUAcceleratorManager: the model token, "NVIDIA RTX A5000" -> RTX-A5000, "NVIDIA A100 80GB
        PCIe" -> A100; a consumer card's whole name, "NVIDIA GeForce RTX 4090" -> GeForce-RTX-4090)."""
        found = _RAY_GPU_NAME.match(gpu)
        model = found.group(1).replace(" ", "-") if found else ""
        if len(model) > 1:
            return model
        return re.sub(r"^NVIDIA\s+", "", gpu).strip().replace(" ", "-")

    def gpu_named(self) -> str:
        return self.gpu

    @classmethod
    def chosen(cls, shared: dict[str, object], min_gpu_ram_in_gb: int | None) -> RunPodSection:
        return cls.model_validate({**shared, "volume_in_gb": 0})  # no pod volume: the run is on its disk

    def ray_gpu(self) -> tuple[str, str] | None:
        return (self.gpu, self.accelerator_type(self.gpu)) if self.gpu_count > 0 else None

    def start_advice(self) -> str | None:
        if not self.starts_from_template:
            return None
        return (
            f"it runs template {self.template_id}'s image and start command, which must run the fleet's "
            'start script (sh -c "$FLEET_BOOTSTRAP"), or set `image`'
        )

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
        "keep their files on it. Needed for num_nodes > 1 (or network_volume): every pod of the cluster "
        "mounts it.",
    )
    network_volume: NetworkVolumeAsk | None = Field(
        None,
        description="A network volume the fleet makes (`{size_in_gb, data_center}`, and a `name`), or finds "
        "from an earlier run of that name, mounted as network_volume_id's is.",
    )
    data_center: DataCenters = Field(
        (),
        max_length=32,
        description="RunPod data centers to rent in (one id or a list, e.g. EU-RO-1), tried in turn while "
        "one has no machine; unset: wherever RunPod places the pod.",
    )
    avoid: Avoided = Field(
        (),
        max_length=64,
        description="Data centers never to rent in: an id (EU-RO-1), a country code in one (RO), or a "
        "location as RunPod names it (Europe).",
    )
    axolotl_git: GitUrl | None = Field(
        None,
        description="Git URL of an axolotl fork the pods install with pip instead of axolotl's release "
        "(the proof of concept's key; trainer: axolotl only). The readiness check reports the commit "
        "installed, and the run's later pods install that same commit.",
    )
    axolotl_git_branch: Token | None = Field(
        None, description="Branch of `axolotl_git` to install (unset: the repository's default branch)."
    )
    axolotl_root: AbsolutePath | None = Field(
        None, description="Where axolotl is checked out in the pod: refused, not yet supported."
    )

    @field_validator("axolotl_root")
    @classmethod
    def _no_axolotl_checkout_yet(cls, value: str | None) -> str | None:
        if value is not None:
            raise ValueError(
                "is not supported yet: the node installs axolotl (its release, or the fork axolotl_git "
                "names) with pip, not into a checkout you place; drop this key"
            )
        return value

    @model_validator(mode="after")
    def _branch_of_a_fork(self) -> RunPodSection:
        if self.axolotl_git_branch is not None and self.axolotl_git is None:
            raise ValueError("axolotl_git_branch names a branch of axolotl_git, which is not set")
        return self

    def axolotl_fork(self) -> tuple[str, str | None] | None:
        if self.axolotl_git is None:
            return None
        url = self.axolotl_git
        if url.startswith("git@"):  # git@host:org/repo -> ssh://git@host/org/repo, as pip wants it
            host, _, path = url[len("git@") :].partition(":")
            url = f"ssh://git@{host}/{path}"
        return f"git+{url}", self.axolotl_git_branch

    head: HeadShape | None = Field(
        None,
        description="The head's own shape in a cluster (num_nodes >= 2): gpu, gpu_count, min_vcpu_count, "
        "min_memory_in_gb, container_disk_in_gb for node 0; the other nodes are rented with the section's.",
    )
