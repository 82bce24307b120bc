"""Credentials: from the environment or a secrets file, never from a job file, an event or a log.

Each credential has one environment variable name (RUNPOD_API_KEY, VAST_API_KEY, ...). The names the fleet
knows are its own (`FLEET_CREDENTIALS`) and those its providers declare (`Provider.credential_names`), which
core cannot see: `providers.registry.load_fleet_secrets` passes them all. The secrets file
(`FLEET_SECRETS_FILE`, else `<config dir>/secrets.yml`) holds the same names as a YAML mapping and must
be readable by its owner only. Values are `SecretStr`: their repr is masked, and only the provider that
needs one (through `ProviderContext.credential`) calls `get_secret_value()`, when it makes a request.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import platformdirs
import yaml
from pydantic import SecretStr

from core.errors import ConfigError, Problem

FLEET_CREDENTIALS = ("HF_TOKEN", "WANDB_API_KEY", "FLEET_DISCORD_BOT_TOKEN", "FLEET_SEAL_KEY")
"""Credentials of the fleet itself, whichever providers there are (the Hub, W&B, the Discord bot, the key
that seals the nodes' tokens in Redis: providers.sealed)."""


@dataclass(frozen=True)
class Secrets:
    """The credentials this process can use, by name, and where the file was looked for."""

    values: dict[str, SecretStr]
    file: Path

    def get(self, name: str) -> SecretStr | None:
        return self.values.get(name)

    def __repr__(self) -> str:
        return f"Secrets(names={sorted(self.values)}, file={self.file})"


def _file_path(environ: dict[str, str]) -> Path:
    explicit = environ.get("FLEET_SECRETS_FILE")
    return Path(explicit) if explicit else Path(platformdirs.user_config_dir("trainfleet")) / "secrets.yml"


def load_secrets(env: dict[str, str] | None = None, *, known: Iterable[str] = ()) -> Secrets:
    """Read the credentials named `known` (and always `FLEET_CREDENTIALS`) from the secrets file (if any)
    and the environment; the environment wins. Any other name in the file is an error."""
    names = tuple(dict.fromkeys([*known, *FLEET_CREDENTIALS]))
    environ = dict(os.environ if env is None else env)
    path = _file_path(environ)
    values: dict[str, SecretStr] = {}
    if path.exists():
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                str(path), [Problem("", "the secrets file must be readable by its owner only (chmod 600)")]
            )
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            # The parser's message may quote the file's text: say only that it is unreadable.
            raise ConfigError(
                str(path), [Problem("", "cannot read the secrets file as a YAML mapping")]
            ) from None
        if not isinstance(data, dict):
            raise ConfigError(str(path), [Problem("", "the secrets file must be a mapping of NAME: value")])
        for key, value in data.items():
            if str(key) not in names:
                raise ConfigError(
                    str(path), [Problem(str(key), f"unknown credential; known: {', '.join(names)}")]
                )
            # A mapping (a cloud's registry logins, by registry) is kept as its JSON text, as the
            # environment gives it.
            text = json.dumps(value) if isinstance(value, dict) else str(value)
            values[str(key)] = SecretStr(text)
    for name in names:
        if environ.get(name):
            values[name] = SecretStr(environ[name])
    return Secrets(values, path)
