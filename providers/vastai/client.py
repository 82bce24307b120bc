"""vast.ai's REST API, wire calls only, through the official `vastai` library (1.9.1).

Queries go in as filter dicts (`{"field": {"op": value}}`), not query strings, so nothing is parsed or
printed by the library and GB -> MB is done here, visibly. `retry=1`: the library would otherwise retry
429/502/503/504 in-line (waiting out a Retry-After of up to a minute, and repeating a create); the
fleet retries its own retryable errors. Every request has a connect and a read timeout (the settings'
api_connect_timeout_s and provider_api_timeout_s; the library's own is 120 s). Vendor errors propagate
as the library raises them (`requests.HTTPError`, `requests.ConnectionError`, `requests.Timeout`); the
adapter translates them.
Listings are parsed here into providers.vastai.models; an answer that does not parse is a ProviderError.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from pydantic import BaseModel, SecretStr, ValidationError

from core.errors import ProviderError
from core.settings import API_CONNECT_TIMEOUT_S, PROVIDER_API_TIMEOUT_S
from providers.vastai.models import VastInstance, VastOffer

SEARCH_LIMIT = 64  # the cheapest offers that pass the filters; more would only be more expensive
LIST_PAGE_ROWS = 25  # instances per request of the paged list (what vastai 1.9's show_instances asks)
MB_PER_GB = 1000  # vast.ai's own factor for cpu_ram and gpu_ram

Filters = dict[str, dict[str, str | float | bool]]
"""A search filter in vast.ai's shape: `{field: {op: value}}`, e.g. `{"num_gpus": {"eq": 2}}`."""

M = TypeVar("M", bound=BaseModel)


def _parse(model: type[M], rows: Iterable[object] | None, what: str) -> list[M]:
    """vast.ai's rows (a list, or nothing) as `model`s; rows that do not parse are a ProviderError."""
    try:
        return [model.model_validate(row) for row in rows or []]
    except (ValidationError, TypeError) as exc:
        raise ProviderError(f"vast.ai sent {what} the fleet cannot read: {_problems(exc)}") from None


def _problems(exc: ValidationError | TypeError) -> str:
    """Where the answer did not parse, without the values (they are the vendor's, maybe secret)."""
    if isinstance(exc, TypeError):
        return "not a list"
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'row'}: {e['msg']}" for e in exc.errors()[:3])


def offer_query(
    gpu: str,
    gpu_count: int,
    *,
    min_vcpus: float | None = None,
    min_memory_gb: float | None = None,
    min_download: float | None = None,
    min_upload: float | None = None,
    min_disk_gb: float | None = None,
    min_reliability: float | None = None,
    min_gpu_ram_gb: float | None = None,
    min_cuda: float | None = None,
    verified_only: bool = True,
    datacenter: bool | None = None,
) -> Filters:
    """A search filter in vast.ai's field names (`_` in a GPU name stands for a space, as in its CLI)."""
    query: Filters = {
        "gpu_name": {"eq": " ".join(gpu.replace("_", " ").split())},
        "num_gpus": {"eq": gpu_count},
        "rentable": {"eq": True},
        "rented": {"eq": False},
        "external": {"eq": False},
    }
    floors = {
        "cpu_cores_effective": min_vcpus,
        "cpu_ram": min_memory_gb * MB_PER_GB if min_memory_gb is not None else None,
        "inet_down": min_download,
        "inet_up": min_upload,
        "disk_space": min_disk_gb,
        "reliability": min_reliability,
        "gpu_ram": min_gpu_ram_gb * MB_PER_GB if min_gpu_ram_gb is not None else None,
        "cuda_max_good": min_cuda,
    }
    query.update({key: {"gte": value} for key, value in floors.items() if value is not None})
    if verified_only:
        query["verified"] = {"eq": True}
    if datacenter is not None:
        query["datacenter"] = {"eq": datacenter}
    return query


class VastAIClient:
    """The calls the fleet makes, each one request (or one paged listing)."""

    def __init__(
        self,
        api_key: SecretStr,
        server_url: str,
        timeouts: tuple[float, float] = (API_CONNECT_TIMEOUT_S, PROVIDER_API_TIMEOUT_S),
    ) -> None:
        # Imported here: the library reads VAST_URL at import; we always pass server_url explicitly.
        from vastai import VastAI  # type: ignore[import-untyped]  # the wheel ships no py.typed

        self._vast: Any = VastAI(
            api_key=api_key.get_secret_value(), server_url=server_url.rstrip("/"), retry=1, raw=True
        )
        self._vast.client.timeout = timeouts  # (connect, read): requests takes either, per request

    def search_offers(self, query: Filters, bid: bool) -> list[VastOffer]:
        """Offers matching `query`, cheapest first. For bids `dph_total` is the machine's minimum bid."""
        offers = self._vast.search_offers(
            dict(query),
            type="bid" if bid else "on-demand",
            order="dph_total",
            limit=SEARCH_LIMIT,
            no_default=True,  # the query carries its own rentable/verified/external filters
        )
        return _parse(VastOffer, offers, "offers")

    def create_instance(
        self,
        offer_id: int,
        *,
        label: str,
        image: str,
        disk_gb: float,
        env: dict[str, str],
        onstart: str,
        price: float | None,
        ssh: bool = False,
        login: str | None = None,
    ) -> int:
        """Rent the offer; `price` (USD/h for the whole machine) makes it a bid; `ssh` launches it with SSH,
        direct and through vast.ai's proxy (runtype `ssh_direc ssh_proxy`; without it none is sent, as
        before); `login`, docker login's arguments for a private image (`image_login`). Returns the instance
        id."""
        made = self._vast.create_instance(
            offer_id,
            image=image,
            disk=disk_gb,
            env=env,
            label=label,
            onstart_cmd=onstart,
            bid_price=price,
            ssh=ssh,
            direct=ssh,
            login=login,
        )
        return int(made["new_contract"])

    def attach_ssh(self, instance_id: int, public_key: str) -> None:
        """Let `public_key` into the instance (`POST /api/v0/instances/{id}/ssh/`)."""
        self._vast.attach_ssh(instance_id, public_key)

    def show_instances(self, pace: Callable[[], None] = lambda: None) -> list[VastInstance]:
        """Every instance of the account: `GET /api/v1/instances/` page after page (the library's
        show_instances does the same, with no way to space the pages), `pace()` between two."""
        rows: list[object] = []
        query: dict[str, Any] = {"select_filters": {}, "order_by": [{"col": "id", "dir": "asc"}]}
        query["limit"] = LIST_PAGE_ROWS
        while True:
            page = self._vast.show_instances_v1(dict(query))
            rows.extend(page.get("instances") or [])
            if not page.get("next_token"):
                return _parse(VastInstance, rows, "instances")
            query["after_token"] = page["next_token"]
            pace()

    def destroy_instance(self, instance_id: int) -> None:
        self._vast.destroy_instance(instance_id)
