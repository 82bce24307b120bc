"""RunPod's GraphQL records as the adapter reads them, and the pod spec it sends.

Attributes are snake_case; RunPod's camelCase names are their aliases (`cost_per_hr` is `costPerHr`).
Only the fields the fleet reads are named: RunPod answers what the query asks (providers.runpod.client),
and may add fields, which are ignored. RunPod sends null for what it does not know (a pod's `runtime`
before its container runs), so every such field is optional with the default the adapter expects.
"""

from __future__ import annotations

from typing import TypedDict

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class RunPodRecord(BaseModel):
    """What every RunPod record model shares: camelCase aliases, extra fields ignored, read-only."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        frozen=True,
        coerce_numbers_to_str=True,
    )


class RunPodGpuType(RunPodRecord):
    """One GPU type of `gpuTypes`, with its per-GPU prices (USD/h) in each cloud; a price is null (or 0)
    where RunPod does not offer it."""

    id: str
    display_name: str | None = ""
    memory_in_gb: int | float | None = None
    secure_price: float | None = None
    community_price: float | None = None
    secure_spot_price: float | None = None
    community_spot_price: float | None = None


class RunPodDataCenter(RunPodRecord):
    """One of RunPod's data centers (`dataCenters`): its id (EU-RO-1), name, and where it is (Europe)."""

    id: str
    name: str | None = None
    location: str | None = None

    @property
    def where(self) -> str:
        """How the fleet says where it is, and what `avoid` is matched against: "EU-RO-1, Europe"."""
        return ", ".join(part for part in (self.id, self.location) if part)


class RunPodVolume(RunPodRecord):
    """A network volume of the account (REST `networkvolumes`): its id, name, size in GB and data center."""

    id: str
    name: str = ""
    size: int = 0
    data_center_id: str = ""


class RunPodPort(RunPodRecord):
    """A port the pod publishes: on a public IP (`is_ip_public`), or through RunPod's HTTP proxy."""

    ip: str | None = None
    is_ip_public: bool | None = None
    private_port: int | None = None
    public_port: int | None = None


class RunPodGpu(RunPodRecord):
    """One of a running pod's GPUs."""

    gpu_util_percent: float | None = None


class RunPodRuntime(RunPodRecord):
    """A pod's container, once it runs."""

    uptime_in_seconds: float | None = None
    ports: list[RunPodPort] | None = None
    gpus: list[RunPodGpu] | None = None


class RunPodPod(RunPodRecord):
    """One pod (`myself.pods`, or what a deploy mutation answers)."""

    id: str
    name: str | None = None
    desired_status: str | None = None
    """RUNNING, EXITED, STOPPED, TERMINATED..."""
    last_status_change: str | None = None
    """Who changed the status last, and when: "Rented by User: <date>", "Exited by Runpod: <date>"."""
    image_name: str | None = None
    cost_per_hr: float | None = None
    runtime: RunPodRuntime | None = None


class RunPodMyself(RunPodRecord):
    pods: list[RunPodPod] | None = None


class GpuTypesData(RunPodRecord):
    """The `data` of the GpuTypes query."""

    gpu_types: list[RunPodGpuType] | None = None


class DataCentersData(RunPodRecord):
    """The `data` of the DataCenters query."""

    data_centers: list[RunPodDataCenter] | None = None


class PodsData(RunPodRecord):
    """The `data` of the Pods query."""

    myself: RunPodMyself | None = None


class DeployData(RunPodRecord):
    """The `data` of the Deploy (on-demand) and Rent (interruptible) mutations: the pod made."""

    pod_find_and_deploy_on_demand: RunPodPod | None = None
    pod_rent_interruptable: RunPodPod | None = None


class TerminateData(RunPodRecord):
    """The `data` of the Terminate mutation, which the fleet does not read (an error is what counts)."""


class EnvVar(TypedDict):
    key: str
    value: str


class PodSpec(TypedDict, total=False):
    """The `input` of a deploy mutation (PodFindAndDeployOnDemandInput, PodRentInterruptableInput), in
    RunPod's names, exactly as sent."""

    name: str
    imageName: str
    gpuTypeId: str
    gpuCount: int
    cloudType: str
    containerDiskInGb: int
    volumeInGb: int
    volumeMountPath: str
    minVcpuCount: int
    minMemoryInGb: int
    ports: str
    env: list[EnvVar]
    supportPublicIp: bool
    startSsh: bool
    networkVolumeId: str
    globalNetwork: bool
    templateId: str
    minDownload: int
    minUpload: int
    terminateAfter: str
    dataCenterId: str
    containerRegistryAuthId: str
    dockerArgs: str
    bidPerGpu: float
