"""What every provider section of a job file shares: the strict base models and their checked types.

A job file has one provider section (``local:``, ``runpod:``, ``vastai:``, ``ssh:``...). Each section model
derives from `SectionBase` (keys every provider has), `MachineSection` (keys of a GPU machine reached over
the network, rented or the operator's own) or `RemoteSection` (keys of a rented one), so a key
means the same thing everywhere and is validated by the same code. Sections are strict: an unknown key is
an error that names it, and values are not coerced (``gpu_count: "2"`` is refused), except that `EnvVars`
values may be given as numbers or booleans.
"""

from __future__ import annotations

import posixpath
import re
import subprocess
from typing import Annotated, ClassVar, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
)

from core import envnames
from core.node_settings import DEFAULT_NODE_IMAGE
from jobs.clouds import Capability

THIRTY_DAYS = 30 * 24 * 3600
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "API_KEY")
# Values that are unmistakably credentials, whatever the variable is called (Hugging Face, RunPod tokens).
_SECRET_VALUE = re.compile(r"\b(hf_[A-Za-z0-9]{30,}|rpa_[A-Za-z0-9]{30,})\b")
RESERVED_ENV_PREFIX = envnames.FLEET_PREFIX  # the node's root, failsafe, token, the fakes' CPU stand-in...
SECRETS_ADVICE = "secrets do not belong in the job file; set them in the fleet's secrets/settings"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _env_name(name: str) -> str:
    if not ENV_NAME.fullmatch(name):
        raise ValueError(f"environment variable name {name!r} must match {ENV_NAME.pattern}")
    why = envnames.refusal(name)  # loader/interpreter variables, the fleet's, Ray's, the vendor's
    if why is not None:
        raise ValueError(f"{name}: {why}")
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

MAX_SCRIPT_BYTES = 16 * 1024
CHECK_SCRIPTS = "check_scripts"
"""The validation context key that asks for `ShellScript`'s parse check (`sh -n`). jobs.problems sets it when
it validates a job file; a run's spec read back from the ledger was checked when it was submitted and is
not checked again, so reading a run never starts a process."""
SHELL_CHECK_TIMEOUT_S = 10.0
_SHELL_LINE = re.compile(r"^sh: (?:line )?(\d+): ")


def _shell_script(script: str, info: ValidationInfo) -> str:
    if "\x00" in script:
        raise ValueError("must not contain NUL characters")
    if len(script.encode("utf-8")) > MAX_SCRIPT_BYTES:
        raise ValueError(f"must be at most {MAX_SCRIPT_BYTES} bytes (16 KiB)")
    if not script.strip():
        raise ValueError("must not be blank")
    if _SECRET_VALUE.search(script):
        raise ValueError(f"the script holds what looks like an access token: {SECRETS_ADVICE}")
    if info.context and info.context.get(CHECK_SCRIPTS):
        shell_problem = shell_syntax_error(script)
        if shell_problem is not None:
            raise ValueError(shell_problem)
    return script


def shell_syntax_error(script: str) -> str | None:
    """What the POSIX shell (`sh -n`, which reads the script without running it) says is wrong with
    `script`, or None when it parses."""
    try:
        done = subprocess.run(
            ["sh", "-n"],
            input=script,
            capture_output=True,
            text=True,
            timeout=SHELL_CHECK_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"could not be checked: the shell took longer than {SHELL_CHECK_TIMEOUT_S:g} s to read it"
    except OSError as exc:
        return f"could not be checked: the shell (sh) did not start: {exc}"
    if done.returncode == 0:
        return None
    said = done.stderr.strip().splitlines()
    first = said[0] if said else f"sh -n exited {done.returncode}"
    where = _SHELL_LINE.match(first)
    if where:
        first = f"line {where.group(1)} of the script: {first[where.end() :]}"
    return f"is not a valid POSIX shell script: {first}"


ShellScript = Annotated[str, StringConstraints(min_length=1), AfterValidator(_shell_script)]
"""A POSIX shell script (one line or many, up to 16 KiB, no NUL), checked with `sh -n` when a job file is
validated (see CHECK_SCRIPTS)."""

PodType = Literal["ON_DEMAND", "INTERRUPTABLE", "auto"]
CloudType = Literal["ALL", "COMMUNITY", "SECURE"]
DEFAULT_IMAGE = DEFAULT_NODE_IMAGE


MAX_NODES = 8


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

    def cluster_problems(self) -> list[tuple[str, str]]:
        """What else the section's cluster needs and lacks, or asks and this provider cannot rent (a run on
        `num_nodes` > 1 machines, the head's own shape), as (key, message); none by default."""
        return []

    @property
    def has_own_head(self) -> bool:
        """Whether node 0 is rented with other keys than the section's (`node_section(0)` differs)."""
        return False

    def node_section(self, node: int) -> Self:
        """The section that rents node `node` of the run's cluster (0: the head): this one, unless the
        provider gives the head its own shape (jobs.sections.head)."""
        return self

    @property
    def asks_volume(self) -> bool:
        """Whether the fleet finds or makes a storage volume for the section's nodes (RunPod's
        `network_volume`): the provision stage asks the provider for it (Provider.volume) first."""
        return False

    def axolotl_fork(self) -> tuple[str, str | None] | None:
        """A fork of axolotl the nodes install instead of its release: (pip's `git+` URL, the branch or
        None for the repository's default), or None (the release: the config's axolotl_version)."""
        return None

    def start_advice(self) -> str | None:
        """What the user should check when the machine never came up, beyond what the fleet saw (a
        provider whose own start command stands in for the fleet's); None when there is nothing more."""
        return None

    one_shot: bool = Field(
        True, description="Terminate the machine when the run ends, whether it succeeded or failed."
    )
    terminate_after: Lifetime = Field(
        86400, description="Hard limit in seconds after which the machine is terminated; -1 disables it."
    )
    env: EnvVars = Field(default_factory=dict)
    debug: bool = Field(
        False,
        description="Verbose logging on the node: the libraries' debug switches (trainer.verbosity's "
        "DEBUG_ENV: NCCL, torch.distributed, transformers, datasets, accelerate), named in the run's node "
        "log.",
    )
    log_eval: bool | None = Field(
        None,
        description="The eval samples table: at each eval, a few eval examples decoded as input, the "
        "model's prediction and the label (eval_samples.jsonl and the W&B run), for both trainers. true: on "
        "(needs an eval set); false: off; unset: on whenever there is an eval set (eval_table_size rows, 4 "
        "by default).",
    )
    prepare_ds_only: bool = Field(
        False,
        description="Only tokenize the datasets into the node's cache (axolotl: its preprocess, into "
        "dataset_prepared_path; the builtin recipe: its own cache), then end SUCCEEDED without training "
        "or pushing; a later run of the same datasets, tokenizer and sequence_len on the same disk (a "
        "network volume, a kept machine, this machine for local:) starts from them.",
    )


class MachineSection(SectionBase):
    """Keys of a GPU machine the fleet reaches over the network and runs the job on: one it rents (RunPod,
    vast.ai: `RemoteSection`) or one of the operator's own, reached over SSH (a pool's)."""

    gpu_count: int = Field(1, ge=1, le=16, description="GPUs on the machine.")
    stop_after: Lifetime = Field(
        900, description="Seconds after which the provider stops the machine; -1 disables it."
    )
    entry: ShellScript | None = Field(
        None,
        description="A POSIX shell script (`entry: |` for several lines, up to 16 KiB) that the prepare "
        "stage runs on the node, in the run's working directory with the section's env, before the model "
        "and data are fetched; a non-zero exit fails the run (ENTRY_FAILED). Checked with `sh -n`.",
    )
    deepspeed: bool = Field(
        False,
        description="Train with DeepSpeed ZeRO stage 2 (trainer/assets/deepspeed_zero2.json, the shape of "
        "axolotl's zero2.json: optimizer states and gradients sharded across the GPUs, bf16 when the "
        "config asks for it): axolotl on two or more GPUs only. A config of your own: the training "
        "config's `deepspeed:` key.",
    )

    def gpu_named(self) -> str:
        """The GPU the section asks for, as its `gpu` key says it ("A100-80GB or H100" for a choice)."""
        raise NotImplementedError(f"{type(self).__name__} must say its GPU")

    def ray_gpu(self) -> tuple[str, str] | None:
        """The machine's GPU by the cloud's name and by Ray's (`accelerator_type:<Ray's>`) when both are
        known before renting, so a worker's pin is checked at submit; None when only the node can tell
        (the cloud's GPU names are not the driver's) or the machine has no GPU."""
        return None


class RemoteSection(MachineSection):
    """Keys shared by the providers that rent a GPU machine (RunPod, vast.ai)."""

    pod_type: PodType = Field(
        "ON_DEMAND",
        description="ON_DEMAND: a machine that is not preempted; INTERRUPTABLE: a spot machine, rented by "
        "bid, that may be (replaced up to max_preemptions times); auto: spot first, then on demand once "
        "spot has no machine or preempted the run more than max_preemptions times.",
    )
    max_preemptions: int = Field(
        2,
        ge=0,
        le=100,
        description="Spot machines lost under the run that are replaced on spot: beyond this many, an "
        "INTERRUPTABLE run fails INSTANCE_LOST and an auto run goes on on demand (the fleet's own "
        "FLEET_MAX_PREEMPTIONS bounds replacements of any kind). Not for ON_DEMAND.",
    )
    cloud_type: CloudType = Field(
        "SECURE", description="SECURE: datacenter hosts only; COMMUNITY: community hosts only; ALL: either."
    )
    max_bid_per_gpu: float = Field(
        2.0, gt=0, le=100, description="Highest price in USD per GPU per hour (bid for INTERRUPTABLE)."
    )
    container_disk_in_gb: int = Field(50, ge=10, le=2048, description="Container disk in GB.")
    min_vcpu_count: int = Field(8, ge=1, le=512, description="At least this many vCPUs.")
    min_memory_in_gb: int = Field(29, ge=1, le=4096, description="At least this much system memory in GB.")
    min_download: int | None = Field(
        None, ge=1, le=100_000, description="At least this download speed, Mbps."
    )
    min_upload: int | None = Field(None, ge=1, le=100_000, description="At least this upload speed, Mbps.")
    image: Token | None = Field(
        None,
        description="Container image the machine runs; unset: the fleet's node_image (with a cloud's "
        "template: the template's). Any image with python3 works: what it lacks of the node's software is "
        "installed at boot.",
    )
    private_image: bool = Field(
        False,
        description="`image` is in a private registry: pulled with the fleet's login for that registry "
        "(each cloud's own, in the fleet's settings or secrets: README, A private image), never a credential "
        "in the job file. A job whose cloud has no login for the image's registry is refused at submit.",
    )
    jupyter: bool = Field(
        False,
        description="Run JupyterLab on the machine (port 8888) with a fresh token of its own, for a look "
        "inside a node kept for debugging; `fleet jupyter RUN` shows its URL to the run's owner.",
    )

    @field_validator("private_image")
    @classmethod
    def _names_the_image(cls, value: bool, info: ValidationInfo) -> bool:
        if value and "image" in info.data and info.data["image"] is None:
            raise ValueError(
                "says the image is private, and the section names none: set `image` (the fleet's default "
                "images are public; a cloud's template's image is pulled with the template's own login)"
            )
        return value

    def renting(self, spot_left: str | None) -> Self:
        """This section as it rents now: `auto` is spot (INTERRUPTABLE) until the run left spot (`spot_left`
        says why), then ON_DEMAND; the other pod types are themselves."""
        if self.pod_type != "auto":
            return self
        return self.model_copy(update={"pod_type": "INTERRUPTABLE" if spot_left is None else "ON_DEMAND"})

    @classmethod
    def chosen(cls, shared: dict[str, object], min_gpu_ram_in_gb: int | None) -> Self:
        """The cloud's section for a machine a `cloud:` section chose on it: the shared keys (and `gpu`, the
        cloud's name) as given, the cloud's own keys at their defaults unless the cloud says otherwise."""
        return cls.model_validate(shared)
