"""The Ray tokens of rented nodes: one fresh token per instance, in an owner-only file under the fleet's
home. The ledger and events hold only the instance name (the reference); the token travels in the
instance's environment at create time and in request headers, never anywhere else. The nodes of one
cluster share its head's token.

A node that runs JupyterLab (`jupyter: true`) has a token of its own for it, made the same way and kept
beside the Ray token (`<name>.jupyter`): shown only to whoever holds the fleet's home (`fleet jupyter`).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

HEAD_SUFFIX = ".head"  # beside a worker node's token: the name of the head it joined
JUPYTER_SUFFIX = ".jupyter"  # beside a node's token: its JupyterLab's token


class NodeTokens:
    """Tokens by instance name, under `<home>/secrets/nodes/` (directory 700, files 600)."""

    def __init__(self, home: Path) -> None:
        self.dir = home / "secrets" / "nodes"

    def _path(self, name: str) -> Path:
        if "/" in name or name.startswith("."):
            raise ValueError(f"not an instance name: {name!r}")
        return self.dir / name

    def ensure(self, name: str) -> str:
        """The instance's token, made now if it has none yet (a relaunch after a crash reuses it)."""
        existing = self.get(name)
        if existing is not None:
            return existing
        token = secrets.token_hex(32)
        self._write(self._path(name), token)
        return token

    def join(self, name: str, head: str) -> str:
        """The token of a worker node that joins `head`'s cluster: the head's own (Ray's token auth lets
        only holders of the cluster's token join). Records that `name` is a worker of `head`."""
        token = self.get(head)
        if token is None:
            raise KeyError(f"no token for the head {head!r}")
        if self.get(name) != token:
            self._path(name).unlink(missing_ok=True)
            self._write(self._path(name), token)
        if self.head_of(name) != head:
            self._path(name + HEAD_SUFFIX).unlink(missing_ok=True)
            self._write(self._path(name + HEAD_SUFFIX), head)
        return token

    def ensure_jupyter(self, name: str) -> str:
        """The token of the node's JupyterLab, made now if it has none yet (a relaunch reuses it)."""
        existing = self.jupyter(name)
        if existing is not None:
            return existing
        token = secrets.token_urlsafe(32)
        self._write(self._path(name + JUPYTER_SUFFIX), token)
        return token

    def jupyter(self, name: str) -> str | None:
        """The node's JupyterLab token; None when it was created without one."""
        return self.get(name + JUPYTER_SUFFIX)

    def head_of(self, name: str) -> str | None:
        """The head whose cluster `name` joined as a worker node; None for a head (or an unknown name)."""
        return self.get(name + HEAD_SUFFIX)

    def _write(self, path: Path, text: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)

    def get(self, name: str) -> str | None:
        try:
            return self._path(name).read_text().strip() or None
        except FileNotFoundError:
            return None

    def forget(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)
        self._path(name + HEAD_SUFFIX).unlink(missing_ok=True)
        self._path(name + JUPYTER_SUFFIX).unlink(missing_ok=True)
