"""The `local` provider: a Ray head on this machine, with token auth, its own ports and temp dir.

It is the default for the demo and the tests, and the model for the cloud providers: an instance is a
head named tf-<run>-<attempt>, it costs nothing, and terminating it stops that head and nothing else.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel

from core.errors import NodeError, ProvisioningFailed
from jobs.sections import ProviderName, SectionBase
from jobs.sections.local import LocalSection
from providers.base import (
    INSTANCE_PREFIX,
    LaunchRequest,
    NodeEndpoint,
    NodeInstance,
    NodeState,
    Offer,
    Provider,
    ProviderContext,
    SshAccess,
    require_ours,
)
from providers.local.client import HeadMeta, LocalHeads, axolotl_python, node_python
from providers.local.sandbox import Sandbox, SandboxUnavailable
from providers.node import jobs_api_answers


class LocalProvider(Provider):
    """Ray heads on this machine, one per run attempt."""

    name: ClassVar[ProviderName] = ProviderName.LOCAL
    section_model: ClassVar[type[SectionBase]] = LocalSection

    def __init__(self, context: ProviderContext) -> None:
        super().__init__(context)
        # The nodes run in their own environment (the node's software only), not the fleet's venv, and in a
        # sandbox (providers.local.sandbox) unless the operator said none: then they share this machine's
        # files as the fleet's own processes; sandboxed, they get a job's files and give back its results
        # as a rented node does, and share only the model cache.
        self.sandbox: Sandbox | None = None
        self._unavailable: str | None = None
        try:
            self.sandbox = Sandbox.of(context.local_sandbox, context.local_node_uid, context.private_paths)
        except SandboxUnavailable as exc:
            self._unavailable = str(exc)
        cache = context.home / "cache"
        self.shares_files = context.local_sandbox == "none"
        self.node_cache_dir = None if self.shares_files else str(cache)
        self.heads = LocalHeads(
            context.home / "nodes", node_python(context.node_python), self.sandbox, (cache,)
        )

    def unavailable(self) -> str | None:
        return self._unavailable

    def list_offers(self, section: BaseModel) -> list[Offer]:
        assert isinstance(section, LocalSection)
        cpus = section.num_cpus or os.cpu_count() or 1
        return [
            Offer(self.name, "this-machine", None, section.num_gpus, 0.0, {"cpus": str(cpus)}),
        ]

    def launch(self, request: LaunchRequest) -> NodeInstance:
        section = request.section
        if not isinstance(section, LocalSection):
            raise ProvisioningFailed(f"local provider got a {type(section).__name__} section")
        require_ours(request.name)
        if self._unavailable is not None:
            raise ProvisioningFailed(self._unavailable)
        try:
            meta = self.heads.start(
                request.name,
                section.num_cpus or os.cpu_count() or 1,
                section.num_gpus,
                request.node_env(section.env),
                python=self._python(request),
                fingerprint=True,
                root=self._root(request),
                readable=request.local_paths,
            )
        except OSError as exc:
            self.heads.stop(request.name)
            raise ProvisioningFailed(f"could not start a local Ray head: {exc}") from exc
        return self._instance(meta)

    def _root(self, request: LaunchRequest) -> Path | None:
        """A sandboxed node's root: in its run's directory (`nodes/<instance>`), so that what it leaves
        (checkpoints, offline W&B files) stays with the run, as an unsandboxed node's does."""
        if self.context.runs_dir is None:
            return None
        return self.context.runs_dir / request.run_id / "nodes" / request.name

    def _python(self, request: LaunchRequest) -> Path:
        """The interpreter the node runs: the axolotl environment for an axolotl job, else the node's own."""
        if request.software.trainer == "axolotl":
            return axolotl_python(self.context.axolotl_python)
        return self.heads.python

    def software_key(self, name: str) -> str | None:
        meta = self.heads.read(name)
        return (meta.software or None) if meta is not None else None

    def get(self, name: str) -> NodeInstance | None:
        meta = self.heads.read(name)
        if meta is None or meta.terminated_at is not None:
            return None
        if not self.heads.processes(meta) and time.time() - meta.created_at > 10:
            return None  # nothing of it runs: gone
        return self._instance(meta)

    def _instance(self, meta: HeadMeta) -> NodeInstance:
        if not self.heads.head_alive(meta):
            log = self.heads.node_dir(meta.name) / "head.log"
            state, message = (
                NodeState.FAILED,
                f"the Ray head exited ({log}): {self.heads.log_tail(meta.name)}",
            )
        elif self._answers(meta):
            state, message = NodeState.RUNNING, "ready"
        else:
            state, message = NodeState.PENDING, "starting"
        return NodeInstance(meta.name, self.name, meta.name, state, meta.created_at, 0.0, message)

    def _answers(self, meta: HeadMeta) -> bool:
        return jobs_api_answers(meta.dashboard_url, self._headers(meta.name))

    def _headers(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.heads.token(name)}"}

    def endpoint(self, name: str) -> NodeEndpoint:
        meta = self.heads.read(name)
        if meta is None or meta.terminated_at is not None:
            raise NodeError(f"no local head named {name!r}")
        return NodeEndpoint(meta.dashboard_url, meta.dashboard_url, self._headers(name))

    def terminate(self, name: str) -> None:
        self.heads.stop(name)

    def ssh_access(self, name: str) -> SshAccess:
        raise NodeError(
            f"{name} is a Ray head on this machine: no SSH needed, its files are under "
            f"{self.heads.node_dir(name)} and the run's under the fleet's runs directory"
        )

    def list_instances(self) -> list[NodeInstance]:
        out = []
        for name in self.heads.names():
            if name.startswith(INSTANCE_PREFIX) and (inst := self.get(name)) is not None:
                out.append(inst)
        return out
