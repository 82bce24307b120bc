"""The settings of the operator's own machines: where their pools are declared and which host keys the
fleet trusts. Read as the fleet's other settings (core.settings.CloudSettings): `FLEET_SSH_POOLS_FILE`,
`ssh_pools_file` in the settings file."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from core.settings import CloudSettings


class SshSettings(CloudSettings):
    """The `ssh:` provider's knobs."""

    ssh_pools_file: Path | None = Field(
        None,
        description="The pools file (providers.ssh.pools: each pool's machines, user, key file, GPUs); "
        "unset: the fleet has no pools and refuses an `ssh:` job, saying so.",
    )
    ssh_known_hosts: Path = Field(
        Path("~/.ssh/known_hosts"),
        description="The known_hosts file that vouches for a pool machine's host key where the pools file "
        "pins none (OpenSSH's format; hashed entries work). An unknown or changed key is refused.",
    )

    @field_validator("ssh_pools_file", "ssh_known_hosts")
    @classmethod
    def _expand(cls, path: Path | None) -> Path | None:
        return None if path is None else path.expanduser()
