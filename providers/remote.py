"""What every rented-node cloud shares, as a template: one instance per name, a Ray head reached with the
node's own token, terminate by name. A cloud says how to list its raw records, read one, and destroy one.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from core.errors import NodeError
from providers.base import (
    INSTANCE_PREFIX,
    NodeEndpoint,
    NodeInstance,
    Provider,
    ProviderContext,
    jobs_api_answers,
)
from providers.tokens import NodeTokens

Record = dict[str, Any]


class RemoteProvider(Provider):
    """A cloud reached through its API (RunPod, vast.ai). Subclasses implement the five hooks below."""

    def __init__(self, context: ProviderContext) -> None:
        super().__init__(context)
        self.tokens = NodeTokens(context.home)

    @abstractmethod
    def _records(self, name: str | None = None) -> list[Record]:
        """Live instances at the vendor (all of ours, or those called `name`), oldest first."""

    @abstractmethod
    def _name(self, record: Record) -> str:
        """The fleet's name of the instance (RunPod's pod name, vast.ai's label)."""

    @abstractmethod
    def _destroy(self, record: Record) -> None:
        """Ask the vendor to destroy it; an instance already gone is not an error."""

    @abstractmethod
    def _instance(self, record: Record, probe: bool) -> NodeInstance:
        """The record as a NodeInstance; with `probe`, RUNNING only once its Jobs API answers (`_ready`)."""

    @abstractmethod
    def _jobs_url(self, record: Record) -> str | None:
        """Where the instance publishes its Ray Jobs API, if it does yet."""

    def _endpoint_url(self, record: Record) -> str | None:
        """The Jobs API URL to use now (a cloud may also require the instance to be running)."""
        return self._jobs_url(record)

    def _headers(self, name: str) -> dict[str, str] | None:
        token = self.tokens.get(name)
        return None if token is None else {"Authorization": f"Bearer {token}"}

    def _ready(self, record: Record) -> bool:
        if self.tokens.head_of(self._name(record)) is not None:
            return True  # a worker node serves no Jobs API: up once its container runs; its head's cluster
            # says whether it joined (the provision stage asks the head)
        url, headers = self._jobs_url(record), self._headers(self._name(record))
        return bool(url and headers and jobs_api_answers(url, headers))

    def get(self, name: str) -> NodeInstance | None:
        records = self._records(name)
        if not records:
            return None
        for extra in records[1:]:  # a retried create made a second one: keep exactly one (the first)
            self._destroy(extra)
        return self._instance(records[0], probe=True)

    def endpoint(self, name: str) -> NodeEndpoint:
        records = self._records(name)
        url = self._endpoint_url(records[0]) if records else None
        headers = self._headers(name)
        if url is None or headers is None:
            raise NodeError(f"instance {name} has no reachable Ray head (yet)")
        return NodeEndpoint(url, url, headers)

    def terminate(self, name: str) -> None:
        for record in self._records(name):
            self._destroy(record)
        if not self._records(name):
            self.tokens.forget(name)

    def list_instances(self) -> list[NodeInstance]:
        ours = [r for r in self._records() if self._name(r).startswith(INSTANCE_PREFIX)]
        return [self._instance(r, probe=False) for r in ours]
