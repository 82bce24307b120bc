"""The Ray tokens of rented nodes: one fresh token per instance, in an owner-only file under the fleet's
home. The ledger and events hold only the instance name (the reference); the token travels in the
instance's environment at create time and in request headers, never anywhere else."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


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
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        token = secrets.token_hex(32)
        fd = os.open(self._path(name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(token)
        return token

    def get(self, name: str) -> str | None:
        try:
            return self._path(name).read_text().strip() or None
        except FileNotFoundError:
            return None

    def forget(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)
