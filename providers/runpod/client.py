"""RunPod's GraphQL API, wire calls only: every request sends its values as GraphQL variables; and its REST
API (v1) for network volumes, which the GraphQL API lists but documents no way to make or delete.

Why not runpod-python for these calls: its f-string queries are not escaped (a `"` in an env value
breaks the request), it has no interruptible pods, and it reads the API key from a module global. The
client raises `RunPodAPIError` as the vendor answered; the adapter (provider.py) translates it. Answers are
parsed here into providers.runpod.models; one that does not parse is a RunPodAPIError too. Every request
has a connect and a read timeout (the settings' api_connect_timeout_s and provider_api_timeout_s): an API
that takes the connection and never answers is a RunPodAPIError with no status (retryable), never a hang.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import requests
from pydantic import BaseModel, SecretStr, ValidationError

from core.settings import API_CONNECT_TIMEOUT_S, PROVIDER_API_TIMEOUT_S
from providers.runpod.models import (
    DataCentersData,
    DeployData,
    GpuTypesData,
    PodsData,
    PodSpec,
    RunPodDataCenter,
    RunPodGpuType,
    RunPodPod,
    RunPodVolume,
    TerminateData,
)

POD_FIELDS = (
    "id name desiredStatus lastStatusChange imageName costPerHr gpuCount "
    "runtime { uptimeInSeconds ports { ip isIpPublic privatePort publicPort type } "
    "gpus { id gpuUtilPercent } }"
)
GPU_TYPES = (
    "query GpuTypes($lowest: GpuLowestPriceInput) { gpuTypes { id displayName memoryInGb "
    "securePrice communityPrice secureSpotPrice communitySpotPrice "
    "lowestPrice(input: $lowest) { minimumBidPrice uninterruptablePrice } } }"
)
DATA_CENTERS = "query DataCenters { dataCenters { id name location } }"
PODS = f"query Pods {{ myself {{ pods {{ {POD_FIELDS} }} }} }}"
ON_DEMAND = (
    "mutation Deploy($input: PodFindAndDeployOnDemandInput!) "
    f"{{ podFindAndDeployOnDemand(input: $input) {{ {POD_FIELDS} }} }}"
)
SPOT = (
    "mutation Rent($input: PodRentInterruptableInput!) "
    f"{{ podRentInterruptable(input: $input) {{ {POD_FIELDS} }} }}"
)
TERMINATE = "mutation Terminate($input: PodTerminateInput!) { podTerminate(input: $input) }"

DEFAULT_REST_URL = "https://rest.runpod.io/v1"  # RunPod's REST API (network volumes)
M = TypeVar("M", bound=BaseModel)


@dataclass
class RunPodAPIError(Exception):
    """What RunPod answered: an HTTP status (0 when no answer came) and its message."""

    status: int
    message: str
    retry_after: float | None = None
    unread: bool = False
    """RunPod answered, but not as expected: what was asked may have been done all the same."""

    def __str__(self) -> str:
        return f"RunPod API {self.status or 'unreachable'}: {self.message}"


class RunPodClient:
    """A small typed client for the calls the fleet makes."""

    def __init__(
        self,
        api_key: SecretStr,
        base_url: str,
        timeouts: tuple[float, float] = (API_CONNECT_TIMEOUT_S, PROVIDER_API_TIMEOUT_S),
        rest_url: str = DEFAULT_REST_URL,
    ) -> None:
        self._key = api_key
        self.url = base_url.rstrip("/") + "/graphql"
        self.rest_url = rest_url.rstrip("/")
        self.connect_timeout_s, self.timeout_s = timeouts  # (connect, read), seconds
        self._session = requests.Session()

    def _send(self, method: str, url: str, body: Any = None) -> tuple[requests.Response, Any]:
        """One request with the account's key: the reply and its JSON (None: none), or RunPodAPIError when
        no answer came."""
        headers = {"Authorization": f"Bearer {self._key.get_secret_value()}"}
        try:
            reply = self._session.request(
                method, url, json=body, headers=headers, timeout=(self.connect_timeout_s, self.timeout_s)
            )
        except requests.ConnectTimeout:
            raise RunPodAPIError(0, f"no connection within {self.connect_timeout_s:g} s") from None
        except requests.Timeout:
            raise RunPodAPIError(0, f"no answer within {self.timeout_s:g} s") from None
        except requests.RequestException as exc:
            raise RunPodAPIError(0, f"connection failed: {type(exc).__name__}") from None
        try:
            return reply, reply.json()
        except ValueError:
            return reply, None

    def call(self, query: str, variables: Mapping[str, object] | None, answer: type[M]) -> M:
        """One GraphQL request; returns its `data` as an `answer`, or raises RunPodAPIError."""
        # JSON all through; typed Any only because requests' JsonType takes no TypedDict (the pod spec).
        request: Any = {"query": query, "variables": variables or {}}
        reply, body = self._send("POST", self.url, request)
        body = body if isinstance(body, dict) else {}
        errors = body.get("errors")
        if reply.status_code != 200 or errors:
            message = str(errors[0].get("message")) if errors else reply.reason or "error"
            retry = reply.headers.get("Retry-After")
            raise RunPodAPIError(reply.status_code, message, float(retry) if retry else None)
        data = body.get("data")
        try:
            return answer.model_validate(data if isinstance(data, dict) else {})
        except ValidationError as exc:
            problems = _problems(exc)
            raise RunPodAPIError(reply.status_code, f"unexpected answer: {problems}", unread=True) from None

    def gpu_types(self, gpu_count: int) -> list[RunPodGpuType]:
        return self.call(GPU_TYPES, {"lowest": {"gpuCount": gpu_count}}, GpuTypesData).gpu_types or []

    def data_centers(self) -> list[RunPodDataCenter]:
        return self.call(DATA_CENTERS, None, DataCentersData).data_centers or []

    def pods(self) -> list[RunPodPod]:
        myself = self.call(PODS, None, PodsData).myself
        return (myself.pods if myself else None) or []

    def deploy_on_demand(self, spec: PodSpec) -> RunPodPod:
        return _made(self.call(ON_DEMAND, {"input": spec}, DeployData).pod_find_and_deploy_on_demand)

    def rent_interruptable(self, spec: PodSpec) -> RunPodPod:
        return _made(self.call(SPOT, {"input": spec}, DeployData).pod_rent_interruptable)

    def terminate(self, pod_id: str) -> None:
        self.call(TERMINATE, {"input": {"podId": pod_id}}, TerminateData)

    def rest(self, method: str, path: str, body: Any = None) -> Any:
        """One REST v1 request (`path` under the REST API's URL); its JSON answer, or RunPodAPIError."""
        reply, answer = self._send(method, f"{self.rest_url}/{path}", body)
        if reply.status_code >= 400:
            said = answer.get("error") or answer.get("message") if isinstance(answer, dict) else None
            retry = reply.headers.get("Retry-After")
            message = str(said or reply.reason or "error")
            raise RunPodAPIError(reply.status_code, message, float(retry) if retry else None)
        return answer

    def network_volumes(self) -> list[RunPodVolume]:
        rows = self.rest("GET", "networkvolumes")
        try:
            return [RunPodVolume.model_validate(row) for row in rows or []]
        except (ValidationError, TypeError) as exc:
            why = _problems(exc) if isinstance(exc, ValidationError) else "not a list"
            raise RunPodAPIError(200, f"unexpected answer: {why}", unread=True) from None

    def create_network_volume(self, name: str, size_gb: int, data_center: str) -> RunPodVolume:
        body = {"name": name, "size": size_gb, "dataCenterId": data_center}
        made = self.rest("POST", "networkvolumes", body)
        try:
            return RunPodVolume.model_validate(made)
        except ValidationError as exc:
            raise RunPodAPIError(200, f"unexpected answer: {_problems(exc)}", unread=True) from None

    def delete_network_volume(self, volume_id: str) -> None:
        self.rest("DELETE", f"networkvolumes/{volume_id}")


def _made(pod: RunPodPod | None) -> RunPodPod:
    """The pod a deploy mutation made; an answer without one is an error (the pod may exist all the same)."""
    if pod is None:
        raise RunPodAPIError(200, "the answer names no pod", unread=True)
    return pod


def _problems(exc: ValidationError) -> str:
    """Where the answer did not parse, without the values (they are the vendor's, maybe secret)."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'data'}: {e['msg']}" for e in exc.errors()[:3])
