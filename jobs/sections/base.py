"""What every provider section of a job file shares: the strict base models and their checked types.

A job file has one provider section (``local:``, ``runpod:`` or ``vastai:``). Each section model derives
from `SectionBase` (keys every provider has) or `RemoteSection` (keys of rented GPU machines), so a key
means the same thing everywhere and is validated by the same code. Sections are strict: an unknown key is
an error that names it, and values are not coerced (``gpu_count: "2"`` is refused), except that `EnvVars`
values may be given as numbers or booleans.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints


class ProviderName(StrEnum):
    """The providers a job section may name."""

    LOCAL = "local"
    RUNPOD = "runpod"
    VASTAI = "vastai"


THIRTY_DAYS = 30 * 24 * 3600
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "API_KEY")
# Values that are unmistakably credentials, whatever the variable is called (Hugging Face, RunPod tokens).
_SECRET_VALUE = re.compile(r"\b(hf_[A-Za-z0-9]{30,}|rpa_[A-Za-z0-9]{30,})\b")
SECRETS_ADVICE = "secrets do not belong in the job file; set them in the fleet's secrets/settings"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _env_name(name: str) -> str:
    if not ENV_NAME.fullmatch(name):
        raise ValueError(f"environment variable name {name!r} must match {ENV_NAME.pattern}")
    if any(word in name for word in _SECRET_WORDS) or name.endswith("_KEY"):
        raise ValueError(f"{name} looks like a secret: {SECRETS_ADVICE}")
    return name


def _env_value_to_str(value: object) -> object:
    """YAML gives ``DEBUG: 1`` or ``FLAG: true``; the environment wants text ("1", "true")."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


def _env_value(value: str) -> str:
    # Never echo the value: it may be a credential.
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    if _SECRET_VALUE.search(value):
        raise ValueError(f"the value looks like an access token: {SECRETS_ADVICE}")
    return value


EnvName = Annotated[str, AfterValidator(_env_name)]
EnvValue = Annotated[
    str, BeforeValidator(_env_value_to_str), Field(max_length=32768), AfterValidator(_env_value)
]
EnvVars = Annotated[
    dict[EnvName, EnvValue],
    Field(max_length=256, description="Extra environment variables for the training process (no secrets)."),
]
"""Environment variables: names like ``MY_VAR``; values text; names or values that look secret refused."""


def _lifetime(seconds: int) -> int:
    if seconds != -1 and not 60 <= seconds <= THIRTY_DAYS:
        raise ValueError(f"must be -1 (disabled) or between 60 and {THIRTY_DAYS} seconds (30 days)")
    return seconds


Lifetime = Annotated[int, AfterValidator(_lifetime)]
"""A duration in seconds: -1 disables it, otherwise 60 s .. 30 days."""


def _absolute_path(value: str) -> str:
    norm = posixpath.normpath(value)
    if not posixpath.isabs(value) or ".." in value.split("/") or _CONTROL.search(value):
        raise ValueError("must be an absolute path without '..' or control characters")
    return norm


AbsolutePath = Annotated[str, Field(min_length=1, max_length=1024), AfterValidator(_absolute_path)]
"""An absolute POSIX path on the node, without '..'."""


def matching(pattern: str, message: str) -> AfterValidator:
    """A validator that refuses text not fully matching `pattern` with a readable `message`."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(message)
        return value

    return AfterValidator(check)


Text = Annotated[
    str,
    StringConstraints(min_length=1, max_length=256),
    matching(r"[^\x00-\x1f\x7f]+", "must be one line, without control characters"),
]
"""A one-line, non-empty value (no newlines or control characters)."""

Token = Annotated[
    str,
    StringConstraints(min_length=1, max_length=256),
    matching(
        r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*", "must be a name without spaces (letters, digits and ._/:@+-)"
    ),
]
"""A name without spaces: an image reference, a git branch, a template id."""

PodType = Literal["INTERRUPTABLE", "ON_DEMAND"]
CloudType = Literal["ALL", "COMMUNITY", "SECURE"]
DEFAULT_IMAGE = "rayproject/ray:2.60.0-py311-gpu"


MAX_NODES = 8


@dataclass(frozen=True)
class Capability:
    """Whether a provider can do something, and why not when it cannot: data that validation reads, so a
    job that needs it is refused up front with the reason instead of being half-started."""

    supported: bool
    reason: str = ""


class SectionBase(BaseModel):
    """Keys every provider section has. Strict: unknown keys and wrong types are errors."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)

    MULTI_NODE: ClassVar[Capability] = Capability(
        False, "this provider cannot join machines into one cluster"
    )
    """Whether `num_nodes` > 1 can run here: several machines on one private network, one Ray cluster."""

    num_nodes: int = Field(
        1,
        ge=1,
        le=MAX_NODES,
        description="Machines in the run's Ray cluster (node 0 the head, the others join it as workers).",
    )

    def multi_node_problems(self) -> list[tuple[str, str]]:
        """What else a run on `num_nodes` > 1 machines of this provider needs and the section lacks, as
        (key, message); none by default."""
        return []

    one_shot: bool = Field(
        True, description="Terminate the machine when the run ends, whether it succeeded or failed."
    )
    terminate_after: Lifetime = Field(
        86400, description="Hard limit in seconds after which the machine is terminated; -1 disables it."
    )
    env: EnvVars = Field(default_factory=dict)


class RemoteSection(SectionBase):
    """Keys shared by the providers that rent a GPU machine (RunPod, vast.ai)."""

    pod_type: PodType = Field(
        "INTERRUPTABLE",
        description="INTERRUPTABLE: a spot/bid machine that may be preempted; ON_DEMAND: not.",
    )
    cloud_type: CloudType = Field(
        "SECURE", description="SECURE: datacenter hosts only; COMMUNITY: community hosts only; ALL: either."
    )
    max_bid_per_gpu: float = Field(
        2.0, gt=0, le=100, description="Highest price in USD per GPU per hour (bid for INTERRUPTABLE)."
    )
    gpu_count: int = Field(1, ge=1, le=16, description="GPUs on the machine.")
    container_disk_in_gb: int = Field(50, ge=10, le=2048, description="Container disk in GB.")
    min_vcpu_count: int = Field(8, ge=1, le=512, description="At least this many vCPUs.")
    min_memory_in_gb: int = Field(29, ge=1, le=4096, description="At least this much system memory in GB.")
    min_download: int | None = Field(
        None, ge=1, le=100_000, description="At least this download speed, Mbps."
    )
    min_upload: int | None = Field(None, ge=1, le=100_000, description="At least this upload speed, Mbps.")
    stop_after: Lifetime = Field(
        900, description="Seconds after which the provider stops the machine; -1 disables it."
    )
    image: Token = Field(DEFAULT_IMAGE, description="Container image the machine runs (must include Ray).")
    entry: Text | None = Field(
        None,
        description="Container arguments, one line; split with shlex and passed as argv, never to a shell.",
    )
    debug: bool = Field(False, description="Verbose provider and node logging.")
    log_eval: bool = Field(False, description="Log evaluation inputs, predictions and labels as a table.")
    deepspeed: bool = Field(
        False, description="Train with DeepSpeed (a ds_config.json next to the job file)."
    )
