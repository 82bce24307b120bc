"""Where the nodes' secrets (providers.tokens) are kept: in owner-only files under one machine's home, or in
the fleet's Redis, sealed, so that workers on several machines, each with a home of its own, serve the
same runs (one provisions a node, another trains on it, a third gives it back).

Sealed means encrypted and authenticated with Fernet (AES-128-CBC and HMAC-SHA256) under the fleet's seal
key: the credential `FLEET_SEAL_KEY` (environment or secrets file), else a key made on first use in
`<home>/secrets/seal.key` (mode 600). Redis and its backups hold only sealed values; every machine of one
fleet needs the same key (set `FLEET_SEAL_KEY` on each, or copy the file), and a machine with another key
gets SealMismatch, naming the key, never a wrong token.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import redis
from cryptography.fernet import Fernet, InvalidToken

from core.errors import ConfigError, Problem, SealMismatch
from state.keys import NODE_SECRETS

SEAL_KEY = "FLEET_SEAL_KEY"
KEY_FILE = "seal.key"  # under <home>/secrets/, when FLEET_SEAL_KEY is not set
OPENED_MAX = 4096  # secrets a process keeps opened (a fleet's live nodes have a few each)


def checked(field: str) -> str:
    """`field` when it can name a secret (an instance name, perhaps with a suffix); else ValueError. Both
    stores check, so that no name reaches outside the directory or hash it belongs in."""
    if not field or "/" in field or field.startswith("."):
        raise ValueError(f"not an instance name: {field!r}")
    return field


class SecretStore(Protocol):
    """Values by field (an instance name and a suffix): written once, read, dropped with the instance."""

    def get(self, field: str) -> str | None: ...

    def add(self, field: str, value: str) -> str:
        """Keep `value` unless the field has one already; the value kept (the first writer's)."""
        ...

    def put(self, field: str, value: str) -> None: ...

    def drop(self, fields: Iterable[str]) -> None: ...


class FileStore:
    """One owner-only file per field in a directory (700) of this machine."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def path(self, field: str) -> Path:
        return self.dir / checked(field)

    def get(self, field: str) -> str | None:
        try:
            return self.path(field).read_text().strip() or None
        except FileNotFoundError:
            return None

    def add(self, field: str, value: str) -> str:
        with contextlib.suppress(FileExistsError):
            write_private(self.path(field), value, exclusive=True)
        return self.get(field) or value

    def put(self, field: str, value: str) -> None:
        write_private(self.path(field), value)

    def drop(self, fields: Iterable[str]) -> None:
        for field in fields:
            self.path(field).unlink(missing_ok=True)


class SealedStore:
    """The fields of one hash in the fleet's Redis, each value sealed under the seal key. Reads fall back
    to this machine's files (`legacy`): the tokens of nodes made before the fleet kept them in Redis."""

    def __init__(self, client: redis.Redis[str], key: bytes, legacy: FileStore, key_source: str) -> None:
        self.client = client
        self.fernet = Fernet(key)
        self.legacy = legacy
        self.key_source = key_source
        self._opened: dict[str, str] = {}  # sealed value -> its secret: each is opened once per process
        # (a look at a node reads its token every tick; Redis is still asked, so a drop is seen at once)

    def get(self, field: str) -> str | None:
        sealed = self.client.hget(NODE_SECRETS, checked(field))
        if sealed is None:
            return self.legacy.get(field)
        if (opened := self._opened.get(sealed)) is not None:
            return opened
        try:
            opened = self.fernet.decrypt(sealed.encode()).decode()
        except InvalidToken:
            raise SealMismatch(
                f"the secret {field!r} in the fleet's Redis was sealed under another seal key than this "
                f"machine's ({self.key_source}): give every machine of the fleet the same {SEAL_KEY} "
                f"(set it on each, or copy <home>/secrets/{KEY_FILE} from the machine that made it)"
            ) from None
        if len(self._opened) >= OPENED_MAX:
            self._opened.clear()
        self._opened[sealed] = opened
        return opened

    def add(self, field: str, value: str) -> str:
        self.client.hsetnx(NODE_SECRETS, checked(field), self._seal(value))
        return self.get(field) or value

    def put(self, field: str, value: str) -> None:
        self.client.hset(NODE_SECRETS, checked(field), self._seal(value))

    def drop(self, fields: Iterable[str]) -> None:
        """Drop the fields from Redis (the legacy files are this machine's: NodeTokens.forget drops them)."""
        names = [checked(field) for field in fields]
        if names:
            self.client.hdel(NODE_SECRETS, *names)

    def _seal(self, value: str) -> str:
        return self.fernet.encrypt(value.encode()).decode()


def seal_key(configured: str | None, home: Path) -> tuple[bytes, str]:
    """The fleet's seal key and where it came from: `configured` (FLEET_SEAL_KEY), else the home's key file,
    made now if there is none. ConfigError, naming where the key came from, when it is not a Fernet key."""
    if configured:
        return _usable(configured.strip().encode(), SEAL_KEY), SEAL_KEY
    path = home / "secrets" / KEY_FILE
    if not path.exists():
        with contextlib.suppress(FileExistsError):
            write_private(path, Fernet.generate_key().decode(), exclusive=True)
    return _usable(path.read_text().strip().encode(), str(path)), str(path)


def _usable(key: bytes, source: str) -> bytes:
    try:
        Fernet(key)  # ValueError: not 32 url-safe base64-encoded bytes
    except ValueError:
        why = "not a seal key: 32 url-safe base64-encoded bytes, as `fleet seal-key` prints one"
        raise ConfigError("secrets", [Problem(source, why)]) from None
    return key


def write_private(path: Path, text: str, exclusive: bool = False) -> None:
    """Write `text` to `path`, readable by its owner only (its directory 700), never seen half written.
    `exclusive`: FileExistsError when the file is there already (the first writer's stays); else replaced."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.unlink(missing_ok=True)  # a crash's leftover
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    try:
        if exclusive:
            os.link(temp, path)  # whole, or not at all: FileExistsError when another was first
        else:
            os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
