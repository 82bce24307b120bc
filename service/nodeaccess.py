"""The ways into a run's node, for a look inside one kept for debugging: SSH (`fleet ssh`) with the fleet's
key, and the node's JupyterLab (`fleet jupyter`, `jupyter: true`), whose URL carries its token. The
provider's record of the instance says where each is published; the ledger says which instance is the
run's. The JupyterLab URL is for the run's owner only: it is returned to the caller and never written to
an event, a log or the ledger. A vast.ai node serves it over TLS with the certificate the fleet made for
that node, which no authority signed: its owner's browser warns, and the certificate's fingerprint is what
tells them it is their node's."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import NodeError, NotFound
from providers.base import INSTANCE_PREFIX, Provider, SshAccess
from providers.node import fingerprint
from service.runs import Fleet
from state.models import Instance


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


@dataclass(frozen=True)
class JupyterAccess:
    """A node's JupyterLab: its URL with the token, and the certificate the fleet made for the node when it
    serves JupyterLab with that one (vast.ai), with the SHA-256 fingerprint a browser shows for it."""

    instance: str
    url: str
    certificate: Path | None = None

    @property
    def sha256(self) -> str | None:
        """The certificate's SHA-256 fingerprint as browsers show it (`AB:CD:...`)."""
        if self.certificate is None:
            return None
        digest = fingerprint(self.certificate).upper()
        return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))

    def trust_note(self) -> str | None:
        """What a browser user needs to know before trusting the URL; None for a certificate an authority
        signed (RunPod's proxy)."""
        if self.certificate is None:
            return None
        return (
            f"JupyterLab on {self.instance} answers with the certificate the fleet made for that node, which "
            "no authority signed, so your browser warns. Go on only if the certificate it shows has the "
            f"SHA-256 fingerprint {self.sha256} (the fleet keeps it in {self.certificate})."
        )

    def view(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "url": self.url,
            "certificate": str(self.certificate) if self.certificate is not None else None,
            "sha256": self.sha256,
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
    return fleet.world.provider(record.provider.value)


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


def jupyter_access(fleet: Fleet, ident: str) -> JupyterAccess:
    """`jupyter_url`, with the certificate pinned for the node when it is what JupyterLab answers with (an
    https URL at the node's own address)."""
    record = run_node(fleet, ident)
    provider = _provider(fleet, record)
    url = provider.jupyter_url(record.name)
    certificate = provider.pinned_certificate(record.name) if url.startswith("https://") else None
    return JupyterAccess(record.name, url, certificate)
