"""The RunPod fake's network volumes: the account's volumes, and RunPod's REST API (v1) over them, served by
the fake under `/v1` (RunPod serves it at https://rest.runpod.io/v1; the fleet's `runpod_rest_url`).

As documented (docs.runpod.io, API reference "network volumes"; runpod/runpod-mcp-ts): `GET
/networkvolumes` lists the account's volumes (`id`, `name`, `size` in GB, `dataCenterId`), `POST
/networkvolumes {name, size, dataCenterId}` makes one (all three required; size 1 to 4000 GB; a data
center RunPod has) and answers it, `DELETE /networkvolumes/{id}` deletes one. The account's key only (a
pod's own key may terminate that pod, nothing else). What RunPod answers to a delete while a pod mounts the
volume is not documented: this fake refuses it (400), which is what keeps a run's data safe, and what the
fleet must not count on being allowed. The same volumes show in GraphQL's `myself { networkVolumes }`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from tests.fakes.base import Request, Response

PATH = "/v1/networkvolumes"
MAX_GB = 4000


@dataclass
class FakeVolume:
    id: str
    name: str
    size: int
    data_center: str

    def row(self) -> dict[str, object]:
        return {"id": self.id, "name": self.name, "size": self.size, "dataCenterId": self.data_center}


@dataclass
class Volumes:
    """The account's network volumes, by id; `centers`, the data centers RunPod has."""

    centers: frozenset[str]
    by_id: dict[str, FakeVolume] = field(default_factory=dict)
    made: int = 0  # volumes made through the API

    def add(self, volume_id: str, data_center: str, name: str | None = None, size: int = 100) -> None:
        self.by_id[volume_id] = FakeVolume(volume_id, name or volume_id, size, data_center)

    def __contains__(self, volume_id: object) -> bool:
        return volume_id in self.by_id

    def __iter__(self) -> Iterator[str]:
        return iter(self.by_id)

    def rows(self) -> list[dict[str, object]]:
        return [v.row() for v in self.by_id.values()]

    def handle(self, request: Request, mounted: Callable[[str], bool]) -> Response:
        """One REST request under PATH; `mounted(id)`: whether a live pod mounts the volume."""
        rest = request.path[len(PATH) :].strip("/")
        if request.method == "GET" and not rest:
            return Response(200, self.rows())
        if request.method == "POST" and not rest:
            return self._make(request.json())
        if request.method == "DELETE" and rest:
            if rest not in self.by_id:
                return Response(404, {"error": f"network volume {rest} not found"})
            if mounted(rest):
                return Response(400, {"error": f"network volume {rest} is in use by a pod"})
            del self.by_id[rest]
            return Response(204, None)
        return Response(404, {"error": "not found"})

    def _make(self, body: object) -> Response:
        if not isinstance(body, dict):
            return Response(400, {"error": "expected a JSON object"})
        name, size, center = body.get("name"), body.get("size"), body.get("dataCenterId")
        unknown = sorted(set(body) - {"name", "size", "dataCenterId"})
        if unknown:
            return Response(400, {"error": f"unknown field(s): {', '.join(unknown)}"})
        if not isinstance(name, str) or not 1 <= len(name) <= 255:
            return Response(400, {"error": "name is required (1 to 255 characters)"})
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_GB:
            return Response(400, {"error": f"size is required: GB, 1 to {MAX_GB}"})
        if center not in self.centers:
            return Response(400, {"error": f"dataCenterId: no data center {center!r}"})
        volume = FakeVolume(secrets.token_hex(5), name, size, str(center))
        self.by_id[volume.id] = volume
        self.made += 1
        return Response(200, volume.row())
