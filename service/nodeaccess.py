"""The ways into a run's node, for a look inside one kept for debugging: SSH (`fleet ssh`) with the fleet's
key, and the node's JupyterLab (`fleet jupyter`, `jupyter: true`), whose URL carries its token. The
provider's record of the instance says where each is published; the ledger says which instance is the
run's. The JupyterLab URL is for the run's owner only: it is returned to the caller and never written to
an event, a log or the ledger."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.models import Instance
from core.errors import NodeError, NotFound
from providers.base import INSTANCE_PREFIX, Provider, SshAccess
from providers.registry import get_provider
from service.runs import Fleet


@dataclass(frozen=True)
class SshCommand:
    """`ssh` into one instance: where, as whom, with which private key (None: ssh's own choice)."""

    instance: str
    provider: str
    access: SshAccess
    identity: Path | None = None

    def argv(self) -> list[str]:
        key = ["-i", str(self.identity)] if self.identity is not None else []
        return ["ssh", "-p", str(self.access.port), *key, f"{self.access.user}@{self.access.host}"]

    def text(self) -> str:
        return shlex.join(self.argv())

    def view(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "provider": self.provider,
            "host": self.access.host,
            "port": self.access.port,
            "user": self.access.user,
            "identity_file": str(self.identity) if self.identity is not None else None,
            "command": self.text(),
        }


def run_node(fleet: Fleet, ident: str) -> Instance:
    """The ledger's record of the node `ident` names: an instance name as is, or a run id (or prefix): its
    current attempt's head. NodeError when the run has no node yet or its node is gone."""
    record = fleet.ledger.get_instance(ident)
    if record is None and not ident.startswith(INSTANCE_PREFIX):
        run = fleet.ledger.find_run(ident)  # NotFound: no such run
        if run.instance is None:
            raise NodeError(f"run {run.run_id} has no node: it never got one ({run.state.value})")
        record = fleet.ledger.get_instance(run.instance)
        if record is None:
            raise NodeError(f"run {run.run_id} has no node yet ({run.state.value})")
    if record is None:
        raise NotFound(f"no run or instance {ident!r} (see `fleet status`, `fleet instances`)")
    if record.state.is_terminal():
        raise NodeError(f"the node {record.name} of run {record.run_id} is gone ({record.state.value})")
    return record


def _provider(fleet: Fleet, record: Instance) -> Provider:
    return get_provider(record.provider.value, fleet.provider_context())


def ssh_command(fleet: Fleet, ident: str) -> SshCommand:
    """The ssh command for the node of `ident` (a run or an instance), from its provider's record of it."""
    record = run_node(fleet, ident)
    access = _provider(fleet, record).ssh_access(record.name)
    key = fleet.settings.ssh_public_key
    return SshCommand(record.name, record.provider.value, access, key.identity_file if key else None)


def jupyter_url(fleet: Fleet, ident: str) -> str:
    """The URL of the JupyterLab on the node of `ident`, with its token: for the run's owner's eyes only."""
    record = run_node(fleet, ident)
    return _provider(fleet, record).jupyter_url(record.name)
