"""The `runpod` provider: on-demand and interruptible (bid) pods, named tf-<run>-<attempt>.

A pod runs a Ray head with token auth (providers.bootstrap) and publishes its Jobs API port as an HTTP
port, which the fleet reaches through RunPod's HTTPS proxy only (`runpod_proxy_url`), never on the pod's
public IP: the token and the job's data cross the internet encrypted, to a name RunPod's certificate vouches
for. RunPod's own `terminateAfter` is set at create,
so a pod dies at the section's `terminate_after` even if the fleet does not; and the pod's failsafe
(providers.onnode.failsafe) terminates it with the pod's own key once the fleet's heartbeat has stopped for
the fleet's `node_heartbeat_timeout_s`.

A run on several pods (`num_nodes`) asks for RunPod's global networking on each: node 0 runs the head,
and every other pod's start script joins it at `<head pod id>.runpod.internal:6379` with the head's token.
All of them mount the run's network volume, which holds the run's files, checkpoints and results.
"""

from __future__ import annotations

import posixpath
import shlex
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel

from core.errors import (
    AuthFailed,
    NoCapacity,
    ProviderError,
    ProviderUnavailable,
    ProvisioningFailed,
    Unreachable,
)
from core.settings import CloudSettings
from jobs.clouds import CloudFacts
from jobs.sections import ProviderName, SectionBase
from providers.base import (
    JUPYTER_PORT,
    JUPYTER_TOKEN_ENV,
    SSH_KEY_ENV,
    LaunchRequest,
    NodeInstance,
    NodeState,
    ProviderContext,
    Refusal,
    SshAccess,
    Unanswered,
    Volume,
)
from providers.bootstrap import (
    BOOTSTRAP_ENV,
    GCS_PORT,
    HEAD_ADDRESS_ENV,
    JOBS_PORT,
    TOKEN_ENV,
    container_command,
    failsafe_env,
    node_setup_env,
)
from providers.offers import DATA_CENTER, Candidate, Choice, Priced, Rule, choose, in_avoided
from providers.onnode.failsafe import RUNPOD_URL_ENV
from providers.remote import RemoteProvider, before_create
from providers.runpod import volumes
from providers.runpod.client import RunPodAPIError, RunPodClient
from providers.runpod.facts import RUNPOD
from providers.runpod.models import PodSpec, RunPodDataCenter, RunPodPod
from providers.runpod.section import RunPodSection
from providers.runpod.settings import RunPodSettings
from trainer.progress import NODE_ROOT_ENV

CREDENTIAL = "RUNPOD_API_KEY"
NO_CAPACITY_MARK = "no longer any instances available"
PRIVATE_DOMAIN = ".runpod.internal"  # global networking: every pod is <pod id>.runpod.internal
SSH_PORT = 22
PRIVATE_HOST = "$RUNPOD_POD_ID" + PRIVATE_DOMAIN  # a pod's own private name, as its start script writes it


def pod_ports(env: dict[str, str]) -> str:
    """The ports a pod publishes (RunPod's `ports`): the Jobs API; JupyterLab's on a node with its token;
    SSH (a TCP port on the pod's public IP) on a node with the fleet's key."""
    ports = [f"{JOBS_PORT}/http"]
    if JUPYTER_TOKEN_ENV in env:
        ports.append(f"{JUPYTER_PORT}/http")
    if SSH_KEY_ENV in env:
        ports.append(f"{SSH_PORT}/tcp")
    return ",".join(ports)


def translate(exc: RunPodAPIError) -> ProviderError:
    """RunPod's answer as one of the fleet's errors (which say whether retrying can help)."""
    if exc.status in (401, 403):
        return AuthFailed(f"RunPod refused the API key (HTTP {exc.status}): {exc.message}")
    if exc.status == 0 or exc.status == 429 or exc.status >= 500 or exc.unread:
        return ProviderUnavailable(str(exc), retry_after=exc.retry_after)
    if NO_CAPACITY_MARK in exc.message.lower():
        return NoCapacity(f"RunPod: {exc.message}")
    return ProviderError(str(exc))


class RunPodProvider(RemoteProvider[RunPodSection, RunPodPod]):
    """Pods on RunPod, through its GraphQL API."""

    name: ClassVar[ProviderName] = RUNPOD.name
    section_model: ClassVar[type[SectionBase]] = RUNPOD.section
    credential_names: ClassVar[tuple[str, ...]] = (CREDENTIAL,)
    vendor: ClassVar[str] = "RunPod"
    facts: ClassVar[CloudFacts | None] = RUNPOD
    settings_model: ClassVar[type[CloudSettings] | None] = RunPodSettings
    record_model: ClassVar[type[BaseModel]] = RunPodPod

    def __init__(self, context: ProviderContext) -> None:
        super().__init__(context)
        self.own = context.cloud(self.name, RunPodSettings)
        self.client = RunPodClient(
            context.credential(CREDENTIAL), self.api_url, context.api_timeouts, self.own.runpod_rest_url
        )

    login_advice: ClassVar[str] = (
        "make a container registry auth on RunPod (Settings > Container Registry Auth) and name its id for "
        "that registry in runpod_registry_auths (FLEET_RUNPOD_REGISTRY_AUTHS)"
    )

    def registry_login(self, server: str) -> str | None:
        return self.own.runpod_registry_auths.get(server)

    def refusal(self, section: BaseModel) -> Refusal | None:
        ask = section.network_volume if isinstance(section, RunPodSection) else None
        if ask is not None and ask.size_in_gb > self.own.runpod_max_volume_gb:
            return Refusal("network_volume.size_in_gb", volumes.too_big(ask, self.own.runpod_max_volume_gb))
        return super().refusal(section)

    # network volumes ------------------------------------------------------------------------------
    def volume(self, section: SectionBase) -> tuple[Volume, bool] | None:
        if not isinstance(section, RunPodSection) or section.network_volume is None:
            return None
        try:
            row, made = volumes.find_or_make(
                self.client, section.network_volume, self.own.runpod_max_volume_gb
            )
        except RunPodAPIError as exc:
            raise translate(exc) from None
        return volumes.as_volume(self.name, row), made

    def volumes(self) -> list[Volume]:
        try:
            return [volumes.as_volume(self.name, row) for row in volumes.ours(self.client)]
        except RunPodAPIError as exc:
            raise translate(exc) from None

    def delete_volume(self, volume_id: str) -> None:
        try:
            volumes.delete(self.client, volume_id)
        except RunPodAPIError as exc:
            raise translate(exc) from None

    def reach_advice(self, cause: Unreachable) -> str | None:
        return {
            Unreachable.CERTIFICATE: "runpod_proxy_ca_file names the authorities trusted for RunPod's proxy; "
            "unset: the system's",
            Unreachable.HOSTNAME: "runpod_proxy_url says where RunPod's proxy is",
        }.get(cause)

    def _proxy_authorities(self) -> Path | None:
        return self.own.runpod_proxy_ca_file

    # offers ---------------------------------------------------------------------------------------
    def choose(self, section: RunPodSection) -> Choice:
        """Every GPU type in both clouds, filtered and priced by the section, cheapest first; with the
        section's `data_center` or `avoid`, each in every data center it allows (an offer per place)."""
        try:
            types = self.client.gpu_types(section.gpu_count)
        except RunPodAPIError as exc:
            raise translate(exc) from None
        places = self._places(section)
        candidates = []
        for gpu, place in ((gpu, place) for gpu in types for place in places):
            for secure in (True, False):
                spot = gpu.secure_spot_price if secure else gpu.community_spot_price
                price = gpu.secure_price if secure else gpu.community_price
                where = {} if place is None else {"location": place.where, DATA_CENTER: place.id}
                candidates.append(
                    Candidate(
                        provider=self.name,
                        offer_id=f"{gpu.id}/{'SECURE' if secure else 'COMMUNITY'}"
                        + (f"/{place.id}" if place is not None else ""),
                        gpu=gpu.id,
                        gpu_count=section.gpu_count,
                        on_demand_per_hour=float(price) * section.gpu_count if price else None,
                        min_bid_per_gpu=float(spot) if spot else None,
                        # RunPod places a pod only on a host meeting these, so they hold by construction.
                        vcpus=section.min_vcpu_count,
                        memory_gb=section.min_memory_in_gb,
                        download_mbps=section.min_download,
                        upload_mbps=section.min_upload,
                        secure=secure,
                        detail={
                            "display_name": str(gpu.display_name),
                            "gpu_memory_gb": str(gpu.memory_in_gb),
                            **where,
                        },
                    )
                )
        avoiding: list[Rule] = [lambda c: in_avoided(c, section.avoid)] if section.avoid else []
        return choose(section, section.gpu, candidates, avoiding)

    def _places(self, section: RunPodSection) -> list[RunPodDataCenter | None]:
        """Where the section lets a pod go: None (wherever RunPod puts it) unless it names data centers or
        avoids some; then its `data_center`s, or else every one of RunPod's (`avoid` leaves some out)."""
        if not section.data_center and not section.avoid:
            return [None]
        try:
            centers = {c.id: c for c in self.client.data_centers()}
        except RunPodAPIError as exc:
            raise translate(exc) from None
        if not section.data_center:
            return list(centers.values())
        unknown = [d for d in section.data_center if d not in centers]
        if unknown:
            has = ", ".join(sorted(centers))
            raise ProvisioningFailed(
                f"data_center: RunPod has no data center {', '.join(unknown)} (it has {has})"
            )
        return [centers[d] for d in section.data_center]

    # lifecycle ------------------------------------------------------------------------------------
    def _create(self, request: LaunchRequest, section: RunPodSection, best: Priced) -> NodeInstance:
        with before_create():  # a worker's spec looks up its head: a failed look made nothing
            spec = self._launch_spec(request, section, best)
        try:
            if best.bid_per_gpu is not None:
                pod = self.client.rent_interruptable({**spec, "bidPerGpu": best.bid_per_gpu})
            else:
                pod = self.client.deploy_on_demand(spec)
        except RunPodAPIError as exc:
            return self._created_anyway(request.name, translate(exc))
        return self._instance(pod, probe=False)

    def _launch_spec(self, request: LaunchRequest, section: RunPodSection, best: Priced) -> PodSpec:
        """The create call's pod spec: the node's environment, its token, the image and command."""
        env = {
            **request.node_env(section.env),
            RUNPOD_URL_ENV: self.api_url,  # where the pod's failsafe terminates it (a fake's in tests)
            **failsafe_env(None, request.heartbeat_timeout_s),  # the deadline is RunPod's terminateAfter
            # what the image lacks of the node's software, installed at boot
            **node_setup_env(request.software),
            **self._access_env(request, section),  # the fleet's SSH key, JupyterLab's token
        }
        volume = request.volume or section.network_volume_id
        if section.network_volume is not None and request.volume is None:
            raise ProvisioningFailed("network_volume: no volume was found or made for the pod")
        if volume or section.volume_in_gb > 0:
            # Runs (checkpoints, the model cache) live on the volume: they outlast a container restart.
            env[NODE_ROOT_ENV] = posixpath.join(section.volume_mount_path, "trainfleet")
        if request.head is None:
            token = self.tokens.ensure(request.name)
        else:  # a worker node: it joins the head's cluster at its private address, with its token
            env[HEAD_ADDRESS_ENV] = self._head_address(request.head)
            token = self.tokens.join(request.name, request.head)
        command = container_command(
            self.name,
            worker=request.head is not None,
            private_host=PRIVATE_HOST if section.num_nodes > 1 else None,
        )
        if section.starts_from_template:  # the template's command runs our script from its environment
            env[BOOTSTRAP_ENV] = command[-1]
        spec = self._pod_spec(request.name, section, env, token, best.candidate, volume)
        if not section.starts_from_template:
            spec["imageName"] = self.context.image(section.image, request.software)
            if auth := self._pull_login(section):  # RunPod pulls a private image with the account's auth
                spec["containerRegistryAuthId"] = auth
            spec["dockerArgs"] = shlex.join(command)
        return spec

    def _pod_spec(
        self,
        name: str,
        section: RunPodSection,
        env: dict[str, str],
        token: str,
        offer: Candidate,
        volume: str | None = None,
    ) -> PodSpec:
        env = {**env, TOKEN_ENV: token}
        spec: PodSpec = {
            "name": name,
            "gpuTypeId": section.gpu,
            "gpuCount": section.gpu_count,
            "cloudType": "SECURE" if offer.secure else "COMMUNITY",
            "containerDiskInGb": section.container_disk_in_gb,
            "volumeInGb": section.volume_in_gb,
            "volumeMountPath": section.volume_mount_path,
            "minVcpuCount": section.min_vcpu_count,
            "minMemoryInGb": section.min_memory_in_gb,
            "ports": pod_ports(env),
            "env": [{"key": k, "value": v} for k, v in sorted(env.items())],
            "supportPublicIp": True,
            "startSsh": SSH_KEY_ENV in env,  # RunPod's images put PUBLIC_KEY in authorized_keys
        }
        if volume:  # mounted at volumeMountPath, in place of a pod volume
            spec["networkVolumeId"] = volume
            del spec["volumeInGb"]
        if place := offer.detail.get(DATA_CENTER):  # the data center of the offer (`data_center`, `avoid`)
            spec["dataCenterId"] = place
        if section.num_nodes > 1:  # the cluster's pods reach each other on RunPod's private network
            spec["globalNetwork"] = True
        if section.template_id:
            spec["templateId"] = section.template_id
        if section.min_download:
            spec["minDownload"] = section.min_download
        if section.min_upload:
            spec["minUpload"] = section.min_upload
        if section.terminate_after != -1:  # a deadline on RunPod's side, should the fleet be gone
            deadline = datetime.now(UTC) + timedelta(seconds=section.terminate_after)
            spec["terminateAfter"] = deadline.isoformat(timespec="seconds")
        return spec

    def _head_address(self, head: str) -> str:
        """Where a worker node joins `head`'s cluster: the head pod's name on RunPod's private network."""
        records = self._records(head) or self._records(head, fresh=True)  # just made: maybe not shown yet
        if not records:
            raise ProvisioningFailed(f"the cluster's head {head} is not there to join")
        return f"{records[0].id}{PRIVATE_DOMAIN}:{GCS_PORT}"

    def _list(self) -> list[RunPodPod]:
        try:
            pods = self.client.pods()
        except RunPodAPIError as exc:
            raise translate(exc) from None
        return [p for p in pods if p.desired_status != "TERMINATED"]

    def _instance(self, pod: RunPodPod, probe: bool) -> NodeInstance:
        runtime = pod.runtime
        unanswered: Unanswered | None = None  # why its head did not answer the probe
        status = pod.desired_status
        if status in ("EXITED", "STOPPED"):  # who stopped it and when, never why (RunPod emails that)
            said = f": {pod.last_status_change}" if pod.last_status_change else ""
            state, message = NodeState.STOPPED, f"pod {status.lower()} (stopped or preempted{said})"
            message += f", image {pod.image_name}" if pod.image_name else ""
        elif runtime is None or self._jobs_url(pod) is None:
            state, message = NodeState.PENDING, "starting"
        elif probe and (unanswered := self._unanswered(pod)) is not None:
            state, message = NodeState.PENDING, f"container up, Ray head not answering yet: {unanswered}"
        else:
            state, message = NodeState.RUNNING, "ready"
        created = time.time() - ((runtime.uptime_in_seconds if runtime else None) or 0)
        utils = [
            g.gpu_util_percent
            for g in (runtime.gpus if runtime else None) or []
            if g.gpu_util_percent is not None
        ]
        return NodeInstance(
            str(pod.name),
            self.name,
            pod.id,
            state,
            created,
            float(pod.cost_per_hr or 0),
            message,
            max(utils) if utils else None,
            unanswered=unanswered,
        )

    def _name(self, record: RunPodPod) -> str:
        return str(record.name or "")

    def _jobs_url(self, pod: RunPodPod) -> str | None:
        return self._published(pod, JOBS_PORT)

    def _published(self, pod: RunPodPod, port: int) -> str | None:
        """RunPod's HTTPS proxy for the port, once the pod runs and publishes it; never the port on the pod's
        public IP, which is plain HTTP across the internet (the Jobs API's carries the node's token)."""
        for mapped in (pod.runtime.ports if pod.runtime else None) or []:
            if mapped.private_port == port:
                return self.own.runpod_proxy_url.format(pod_id=pod.id, port=port).rstrip("/")
        return None

    def _ssh(self, pod: RunPodPod) -> SshAccess | None:
        """Port 22 as RunPod maps it: a TCP port on the pod's public IP."""
        for mapped in (pod.runtime.ports if pod.runtime else None) or []:
            if mapped.private_port == SSH_PORT and mapped.is_ip_public and mapped.ip and mapped.public_port:
                return SshAccess(mapped.ip, mapped.public_port)
        return None

    def _destroy(self, record: RunPodPod) -> None:
        try:
            self.client.terminate(record.id)
        except RunPodAPIError as exc:
            if "not found" not in exc.message.lower():
                raise translate(exc) from None
