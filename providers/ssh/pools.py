"""The operator's machines: pools of hosts the fleet reaches over SSH, declared in a file (`pools.yml`).

A pool is machines one team owns, alike enough that a job asks for the pool by name (`ssh: {pool: lab}`).
Each machine names its host, port, user and the fleet's private key for it (a path on the fleet's machine;
a key itself is never in the file), its GPUs (how many, of which type, in `jobs.gpus`' names), labels a job
may ask for, an optional hourly price (for budgets and reports; an owned machine costs 0 unless said), and
optionally its host key, pinned (else the fleet's known_hosts file must know it). What a pool sets is every
machine's default:

    pools:
      lab:
        user: fleet
        key: ~/.ssh/fleet_lab
        hourly_usd: 1.20
        machines:
          - host: gpu1.lab.example
            gpus: 8
            gpu: A100-80GB
            labels: [nvlink]
          - {host: gpu2.lab.example, port: 2222, gpus: 4, gpu: L40S}

The file is read as a job file is (jobs.yamlsafe: no tags, no aliases, duplicate keys refused) and
validated strictly: an error names the key path and its line.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from core.errors import ConfigError, Problem
from core.sshkey import KEY_TYPES
from jobs import gpus
from jobs.problems import line_of, validate_mapping
from jobs.yamlsafe import join_path, load_yaml, read_job_file

NAME = r"^[a-z0-9][a-z0-9-]{0,31}$"
"""A pool's name (it is part of claim keys and of `ssh:NAME` in a `cloud:` section's clouds)."""
HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9.:-]*[A-Za-z0-9])?$")
"""A host name, IPv4 or IPv6 address: no spaces, no '@', no option-like leading '-'."""
USER = r"^[a-z_][a-z0-9_.-]{0,31}$"
Label = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")]


class MachineDefaults(BaseModel):
    """What a pool may set for all its machines, and each machine for itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    user: str | None = Field(
        None, pattern=USER, description="The user the fleet logs in as (the job runs as it)."
    )
    key: Path | None = Field(
        None, description="The fleet's private key file for that user (a path, never the key)."
    )
    hourly_usd: float | None = Field(
        None, ge=0, le=1000, description="What an hour of the machine costs (budgets, reports); 0 when unset."
    )

    @field_validator("key")
    @classmethod
    def _expand(cls, key: Path | None) -> Path | None:
        return None if key is None else key.expanduser()


class MachineSpec(MachineDefaults):
    """One machine of a pool as the file declares it."""

    host: str = Field(description="Its host name or address, as the fleet reaches it.")
    port: int = Field(22, ge=1, le=65535, description="Its SSH port.")
    gpus: int = Field(0, ge=0, le=64, description="How many GPUs it has (0: a CPU machine).")
    gpu: str | None = Field(None, description="Their type, in jobs.gpus' names (A100-80GB, H100, L40S...).")
    labels: list[Label] = Field(default_factory=list, description="Labels a job's `labels` may ask for.")
    host_key: str | None = Field(
        None, description="Its SSH host key, pinned ('ssh-ed25519 AAAA...'); else known_hosts must know it."
    )

    @field_validator("host")
    @classmethod
    def _host(cls, host: str) -> str:
        if not HOST.match(host):
            raise ValueError(f"{host!r} is not a host name or address")
        return host

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, gpu: str | None) -> str | None:
        if gpu is None:
            return None
        types = gpus.resolve(gpu)
        if len(types) != 1:
            raise ValueError(f"{gpu!r} is a group of GPU types ({', '.join(types)}); a machine has one type")
        return types[0]

    @field_validator("host_key")
    @classmethod
    def _host_key(cls, line: str | None) -> str | None:
        if line is None:
            return None
        parts = line.split()
        if len(parts) < 2 or parts[0] not in KEY_TYPES:
            raise ValueError("must be a public host key line: '<type> <base64>' (ssh-keyscan prints it)")
        return f"{parts[0]} {parts[1]}"

    @model_validator(mode="after")
    def _gpus_and_type(self) -> MachineSpec:
        if self.gpus and self.gpu is None:
            raise ValueError("a machine with gpus names their type: `gpu`")
        if self.gpu is not None and not self.gpus:
            raise ValueError("`gpu` names a type but `gpus` is 0")
        return self


class PoolSpec(MachineDefaults):
    """A pool: its machines and what they share."""

    machines: list[MachineSpec] = Field(min_length=1, max_length=256, description="The pool's machines.")

    @model_validator(mode="after")
    def _distinct(self) -> PoolSpec:
        seen = [f"{m.host}:{m.port}" for m in self.machines]
        twice = sorted({a for a in seen if seen.count(a) > 1})
        if twice:
            raise ValueError(f"a machine is listed twice: {', '.join(twice)}")
        return self


class Machine(BaseModel):
    """One machine, its pool's defaults applied: what the provider connects to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pool: str
    host: str
    port: int
    user: str
    key: Path
    gpus: int
    gpu: str | None
    labels: tuple[str, ...]
    hourly_usd: float
    host_key: str | None

    @property
    def name(self) -> str:
        """How the fleet names it: host, and port when not 22."""
        return self.host if self.port == 22 else f"{self.host}:{self.port}"

    @property
    def address(self) -> str:
        """Its key in known_hosts: `host`, or `[host]:port` off port 22."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"


class Pools(BaseModel):
    """Every pool of the file, by name, its machines complete."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pools: dict[str, tuple[Machine, ...]] = Field(default_factory=dict)
    source: str = ""

    def machines(self, pool: str) -> tuple[Machine, ...]:
        """The pool's machines; KeyError when there is no such pool."""
        return self.pools[pool]

    def every(self) -> Iterator[Machine]:
        """Every machine of every pool."""
        return (m for machines in self.pools.values() for m in machines)


def read_pools(path: Path) -> Pools:
    """The pools declared in `path`; ConfigError naming each problem's key path and line."""
    document = load_yaml(read_job_file(path), source=str(path))
    return parse_pools(document.data, document.lines, str(path))


def parse_pools(data: dict[str, Any], lines: dict[str, int], source: str) -> Pools:
    """Validate a pools file's data (as jobs.yamlsafe reads it)."""
    problems: list[Problem] = []
    unknown = sorted(set(data) - {"pools"})
    problems += [
        Problem(k, "unknown key; a pools file has `pools:` only", line_of(lines, k)) for k in unknown
    ]
    raw = data.get("pools")
    if not isinstance(raw, dict) or not raw:
        problems.append(
            Problem("pools", "must map each pool's name to its machines", line_of(lines, "pools"))
        )
        raise ConfigError(source, problems)
    found: dict[str, tuple[Machine, ...]] = {}
    for name, body in raw.items():
        where = join_path("pools", name)
        if not re.match(NAME, name):
            message = "a pool's name is lower-case letters, digits and '-', at most 32"
            problems.append(Problem(where, message, line_of(lines, where)))
            continue
        spec = validate_mapping(PoolSpec, body, where, lines, problems)
        if spec is not None:
            found[name] = tuple(_complete(name, spec, i, lines, problems) for i in range(len(spec.machines)))
    if problems:
        raise ConfigError(source, problems)
    return Pools(pools=found, source=source)


def _complete(
    pool: str, spec: PoolSpec, index: int, lines: dict[str, int], problems: list[Problem]
) -> Machine:
    m = spec.machines[index]
    where = join_path(join_path(join_path("pools", pool), "machines"), index)
    user, key = m.user or spec.user, m.key or spec.key
    for field, value in (("user", user), ("key", key)):
        if value is None:
            message = f"no `{field}`: set it on the machine or on the pool"
            problems.append(Problem(join_path(where, field), message, line_of(lines, where)))
    hourly = m.hourly_usd if m.hourly_usd is not None else spec.hourly_usd
    return Machine(
        pool=pool,
        host=m.host,
        port=m.port,
        user=user or "",
        key=key or Path(),
        gpus=m.gpus,
        gpu=m.gpu,
        labels=tuple(m.labels),
        hourly_usd=hourly or 0.0,
        host_key=m.host_key,
    )
