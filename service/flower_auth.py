"""Flower's password: always one. Either `FLOWER_BASIC_AUTH` (user:password, comma-separated for more) from
the environment, or one the fleet generates on Flower's first start and keeps in an owner-only file under
the fleet home (`<home>/flower/basic-auth`, 0600 in a 0700 directory).

A generated password is shown once, when it is made; later starts say only where it is kept. It reaches
Flower inside the process (never on a command line, which `ps` shows to every user, nor in the
environment of any process), and no error here ever quotes it.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from core.errors import ConfigError, Problem

BASIC_AUTH_ENV = "FLOWER_BASIC_AUTH"
USER = "fleet"
AUTH_FILE = "basic-auth"
PASSWORD_BYTES = 24  # token_urlsafe(24): 32 characters, 192 bits


@dataclass(frozen=True)
class FlowerAuth:
    """The `user:password` pairs Flower accepts, where they came from, and whether this start made them
    (the only time a password is shown)."""

    credentials: tuple[SecretStr, ...]
    source: str  # the file's path, or the environment variable's name
    created: bool = False

    @property
    def user(self) -> str:
        return self.credentials[0].get_secret_value().partition(":")[0]

    def plain(self) -> list[str]:
        """`user:password` for each credential, for Flower's `basic_auth` option (in this process only)."""
        return [c.get_secret_value() for c in self.credentials]


def _from_env(value: str) -> FlowerAuth:
    credentials = []
    for entry in value.split(","):
        user, colon, password = entry.partition(":")
        if not (user and colon and password):
            raise ConfigError(
                BASIC_AUTH_ENV,
                [Problem("", "must be user:password (comma-separated for more); its value is not shown")],
            )
        credentials.append(SecretStr(entry))
    return FlowerAuth(tuple(credentials), BASIC_AUTH_ENV)


def _read(path: Path) -> FlowerAuth:
    mode = path.lstat().st_mode
    if not stat.S_ISREG(mode) or mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            str(path),
            [Problem("", "Flower's password file must be a regular file of its owner's (chmod 600)")],
        )
    text = path.read_text(encoding="utf-8").strip()
    user, colon, password = text.partition(":")
    if not (user and colon and password) or "\n" in text:
        why = "Flower's password file must hold one line user:password; delete it to have a new one made"
        raise ConfigError(str(path), [Problem("", why)])
    return FlowerAuth((SecretStr(text),), str(path))


def _create(path: Path) -> FlowerAuth:
    """A fresh password in a new 0600 file (O_EXCL: two starts at once cannot both write one)."""
    credential = f"{USER}:{secrets.token_urlsafe(PASSWORD_BYTES)}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(credential + "\n")
    return FlowerAuth((SecretStr(credential),), str(path), created=True)


def flower_auth(state_dir: Path, environ: Mapping[str, str]) -> FlowerAuth:
    """Flower's credentials: `FLOWER_BASIC_AUTH` when set, else the kept file's, else new ones (made now,
    `created`). Raises ConfigError (never quoting a password) on a malformed value or an unsafe file."""
    if environ.get(BASIC_AUTH_ENV):
        return _from_env(environ[BASIC_AUTH_ENV])
    state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)  # Flower's state (task history) beside it is the owner's too
    path = state_dir / AUTH_FILE
    try:
        return _create(path)
    except FileExistsError:
        return _read(path)
