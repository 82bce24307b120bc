"""The provider contract: what every GPU cloud (and this machine) must do for the fleet.

A provider rents nodes whose name is the fleet's deterministic instance name `tf-<run>-<attempt>` (a
cluster's: `tf-<run>-<attempt>-<k>`), so a lookup by name finds what an earlier, interrupted attempt
created. Every call here is short: none waits for a node to come up (the provision stage polls).
`terminate` is idempotent. Providers raise only the errors of core.errors (ProviderError and its
subclasses), translated from their vendor's.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import ClassVar, TypeVar

import redis
from pydantic import BaseModel, SecretStr

from core import envnames
from core.errors import CredentialsMissing, NodeError, ProvisioningFailed, Unreachable
from core.node_settings import DEFAULT_AXOLOTL_IMAGE, DEFAULT_NODE_IMAGE
from core.settings import API_CONNECT_TIMEOUT_S, PROVIDER_API_TIMEOUT_S, CloudSettings
from jobs.clouds import CloudFacts
from jobs.sections import ProviderName, SectionBase
from providers.listing import ListingCache
from providers.sealed import SecretStore
from trainer.config import AxolotlConfig, FleetKeys, TrainerName

INSTANCE_PREFIX = "tf-"
log = logging.getLogger(__name__)


class NodeState(StrEnum):
    """An instance as its provider reports it."""

    PENDING = "PENDING"  # created, not ready yet
    RUNNING = "RUNNING"  # up, and its Ray head answers (a worker node: its container runs; its head's
    # cluster says whether it joined)
    FAILED = "FAILED"  # will never become ready (exited, crashed)
    STOPPED = "STOPPED"  # stopped or preempted; may still bill storage


@dataclass(frozen=True)
class Offer:
    """Something a provider can rent out now, with its price."""

    provider: ProviderName
    offer_id: str
    gpu: str | None
    gpu_count: int
    price_per_hour: float
    detail: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Unanswered:
    """Why a node's Ray head gave the fleet no answer: the cause, its words (the TLS library's, the HTTP
    status) and the URL called, which names the node (RunPod's proxy, a vast.ai host's address) and never
    carries a credential."""

    cause: Unreachable
    detail: str
    endpoint: str

    def __str__(self) -> str:
        return f"{self.cause.value} at {self.endpoint}: {self.detail}"


@dataclass(frozen=True)
class NodeInstance:
    """A live instance of ours at a provider."""

    name: str
    provider: ProviderName
    provider_id: str
    state: NodeState
    created_at: float
    price_per_hour: float = 0.0
    message: str = ""
    gpu_util: float | None = None  # busiest GPU's utilization in %, where the provider reports it
    unanswered: Unanswered | None = None
    """PENDING because its Ray head's probe got no answer (`get` probes): why; None when not probed."""

    @property
    def age_s(self) -> float:
        return time.time() - self.created_at

    @property
    def look(self) -> str:
        """The instance as a parked run watches it (broker.parking.Watch.nodes): its state, and the cause
        its head's probe met, so that a new cause wakes the run as a new state does."""
        cause = self.unanswered.cause.value if self.unanswered is not None else ""
        return f"{self.state.value}:{cause}" if cause else self.state.value


@dataclass(frozen=True)
class NodeEndpoint:
    """How to reach a node's Ray head. `headers` carry the node's token: never log or store them.

    Every call goes through providers.node.channel, which refuses plain HTTP but to this machine (the local
    provider's heads). `tls_pin` is the node's own certificate (providers.tokens), the only one trusted for
    it, whatever its address; else `ca_file` names the authorities trusted for an HTTPS proxy in front of
    the node (None: the system's), and the proxy's name is checked."""

    jobs_url: str
    dashboard_url: str
    headers: dict[str, str] = field(repr=False)
    tls_pin: Path | None = None
    ca_file: Path | None = None


@dataclass(frozen=True)
class SshAccess:
    """Where a node's SSH server is published: `ssh -p <port> <user>@<host>`."""

    host: str
    port: int
    user: str = "root"


NO_SSH_ADVICE = (
    "set the fleet's ssh_public_key (FLEET_SSH_PUBLIC_KEY, or ssh_public_key in the settings file: the key's "
    "text or the path of its .pub file) and run the job again: nodes created from then on get SSH"
)
JUPYTER_PORT = 8888  # JupyterLab inside a node (`jupyter: true`), published by the provider
JUPYTER_TOKEN_ENV = "FLEET_JUPYTER_TOKEN"  # its token arrives in the node's environment under this name
SSH_KEY_ENV = envnames.SSH_PUBLIC_KEY  # the fleet's SSH public key in a node's env (RunPod images read it)


@dataclass(frozen=True)
class NodeSoftware:
    """What a node must run besides Ray: the builtin recipe's node software, or axolotl at a release."""

    trainer: TrainerName = "builtin"
    axolotl_version: str | None = None
    """The axolotl release (an axolotl job's `axolotl_version`, else the fleet's setting)."""
    axolotl_source: str | None = None
    """A fork installed instead of a release: pip's `git+URL`, with `@branch` or `@commit` when known."""

    @classmethod
    def of(
        cls,
        train: FleetKeys,
        axolotl_version: str,
        fork: tuple[str, str | None] | None = None,
        commit: str | None = None,
    ) -> NodeSoftware:
        """What a job's nodes run: axolotl at the job's release (else `axolotl_version`), or the fork the
        section names (`fork`: SectionBase.axolotl_fork) at the `commit` the run's first node got, else
        at its branch; or the builtin's."""
        if isinstance(train, AxolotlConfig):
            if fork is not None:
                url, branch = fork
                ref = commit or branch
                return cls("axolotl", None, url + (f"@{ref}" if ref else ""))
            return cls("axolotl", train.axolotl_version or axolotl_version)
        return cls()


@dataclass(frozen=True)
class LaunchRequest:
    """What to start: the instance's name, the run it is for, the job's provider section, the
    credentials the node needs itself (HF_TOKEN, WANDB_API_KEY), and how long the node's failsafe waits for
    the fleet's heartbeat before it gives the node back (None: it does not). The credentials go into the
    node's environment at start, and nowhere else: not in a Ray job's runtime_env, which Ray writes to its
    own logs. `head` names the instance whose Ray head this one joins as a worker node (a cluster's node
    k > 0, over the provider's private network, with the head's token); None: it runs a head itself."""

    name: str
    run_id: str
    section: BaseModel
    secrets: Mapping[str, SecretStr] = field(default_factory=dict)
    heartbeat_timeout_s: float | None = None
    head: str | None = None
    software: NodeSoftware = NodeSoftware()
    offer: str | None = None
    """The offer to rent (a `cloud:` job's choice, workers.failover); None: the cheapest that fits now."""
    local_paths: tuple[Path, ...] = ()
    """The absolute paths of this machine the job's node reads in place (a local model: jobs.paths.node_paths,
    confined at validate); a sandboxed local node is shown them read-only. Rented nodes ignore them."""
    volume: str | None = None
    """The id of the storage volume the provision stage found or made for the section (`Provider.volume`),
    which the node mounts; None: the section asks for none the fleet makes."""

    def node_env(
        self, section_env: Mapping[str, str], own: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """The node's environment: the section's `env` less the names a job may not set (validation refuses
        them; a job in the ledger from before it did is held here too), then the secrets, then `own`, the
        fleet's values for the node: written last, so nothing of the job's overrides them."""
        dropped = sorted(name for name in section_env if not envnames.job_may_set(name))
        if dropped:  # names only: the values may be anything
            log.warning("%s: the job's env may not set %s; left out", self.name, ", ".join(dropped))
        job = {k: v for k, v in section_env.items() if envnames.job_may_set(k)}
        return {**job, **{k: v.get_secret_value() for k, v in self.secrets.items()}, **(own or {})}


C = TypeVar("C", bound=CloudSettings)


@dataclass(frozen=True)
class ProviderContext:
    """What a provider may use: the fleet's home, its credentials (by name, masked) and API base URLs."""

    home: Path
    credentials: Mapping[str, SecretStr] = field(default_factory=dict)
    urls: Mapping[str, str] = field(default_factory=dict)  # provider name -> API base URL override
    ssh_public_key: str | None = None  # the fleet's SSH public key line, installed on every rented node
    node_python: Path | None = None  # the local nodes' Python (settings.node_python); None: found
    default_image: str = DEFAULT_NODE_IMAGE  # a rented node's image when its section names none
    axolotl_python: Path | None = None  # the local nodes' Python for axolotl jobs; None: .venv-axolotl
    axolotl_image: str = DEFAULT_AXOLOTL_IMAGE  # ... and a rented node's image for them
    api_timeouts: tuple[float, float] = (API_CONNECT_TIMEOUT_S, PROVIDER_API_TIMEOUT_S)  # connect, read (s)
    clouds: Mapping[str, CloudSettings] = field(default_factory=dict)  # each cloud's own settings, by name
    listings: ListingCache | None = None  # instance lists shared by the fleet's processes (None: not shared)
    node_secrets: SecretStore | None = None  # the nodes' tokens, sealed in Redis (None: the home's files)
    local_sandbox: str = "auto"  # how a local node is kept from the fleet (providers.local.sandbox)
    local_node_uid: int = 65533  # ... and the uid it runs as when the fleet runs as root
    private_paths: tuple[Path, ...] = ()  # what a local node must not see: settings, secrets, runs
    runs_dir: Path | None = None  # the run directories (a sandboxed local node's root is in its run's)
    client: redis.Redis[str] | None = None  # the fleet's Redis (pool machines' claims), when it has one

    def image(self, section_image: str | None, software: NodeSoftware) -> str:
        """The image a rented node starts: its section's, else the default for what it runs."""
        if section_image:
            return section_image
        return self.axolotl_image if software.trainer == "axolotl" else self.default_image

    def cloud(self, name: str, model: type[C]) -> C:
        """The cloud `name`'s own settings as the world gave them, else `model`'s defaults."""
        found = self.clouds.get(name)
        return found if isinstance(found, model) else model()

    def credential(self, name: str) -> SecretStr:
        """The named credential; CredentialsMissing (naming it, never showing it) when absent."""
        value = self.credentials.get(name)
        if value is None or not value.get_secret_value():
            where = "the environment or the fleet's secrets file (mode 600), never in a job file"
            raise CredentialsMissing(f"{name} is not set: put it in {where}")
        return value


@dataclass(frozen=True)
class Volume:
    """A storage volume of the fleet's at a provider (a RunPod network volume), and its monthly cost."""

    provider: ProviderName
    volume_id: str
    name: str
    where: str  # its data center
    size_gb: int
    monthly_usd: float


@dataclass(frozen=True)
class Refusal:
    """Why a provider cannot run a section as the fleet is set up, and the section's key that asks it."""

    key: str
    why: str


def require_ours(name: str) -> None:
    """Refuse to create an instance whose name the fleet would not recognise as its own."""
    if not name.startswith(INSTANCE_PREFIX):
        raise ProvisioningFailed(f"instance names start with {INSTANCE_PREFIX!r}: {name!r}")


class Provider(ABC):
    """One GPU cloud. Subclasses declare themselves in the class attributes below and implement the six
    calls; `providers.registry` derives the fleet's credential names and API URLs from the declarations,
    and a unit test checks them against `jobs.sections.section_models()`."""

    name: ClassVar[ProviderName]
    """The provider's name, as a job file's section key names it."""
    section_model: ClassVar[type[SectionBase]]
    """The model of its section of a job file (a cloud's in its package, reaching the job's data through
    its facts); the same class as `section_models()[name]`. `list_offers` and `launch` get an instance of
    it."""
    credential_names: ClassVar[tuple[str, ...]] = ()
    """The credentials it needs (environment variable / secrets-file names), e.g. ("RUNPOD_API_KEY",).
    The fleet's secrets are read under these names, plus the fleet's own (core.secrets.FLEET_CREDENTIALS)."""
    optional_credentials: ClassVar[tuple[str, ...]] = ()
    """The credentials it uses where a job needs them and the fleet has them (a private registry's login),
    read as `credential_names` are; their absence refuses only the jobs that need them (`refusal`)."""
    facts: ClassVar[CloudFacts | None] = None
    """What the job's data and the fleet's checks know of the cloud (providers/<cloud>/facts.py): its GPU
    names, whether its offers say where they are, the names it sets in its nodes' environment; the
    registry declares them to jobs.clouds and core.envnames."""
    settings_model: ClassVar[type[CloudSettings] | None] = None
    """The cloud's own settings (providers/<cloud>/settings.py): its API's URL (`CloudSettings.API_URL`),
    how its nodes are reached. The fleet's settings class derives from each (providers.registry), the world
    hands each provider its own in `ProviderContext.clouds[name]` and its API's URL in `urls[name]`."""
    shares_files: bool = False
    """Whether the node sees this machine's files (an unsandboxed local head does; a rented node, or a
    sandboxed local one, gets the job's files through the Ray job's runtime_env, and its results come back
    through jobs.shipping / trainer.pack)."""
    node_cache_dir: str | None = None
    """Where the node keeps base models (TrainJob.cache_dir) when it does not share this machine's files:
    None: `cache` under its own root (a rented node's disk)."""

    def __init__(self, context: ProviderContext) -> None:
        self.context = context

    def unavailable(self) -> str | None:
        """Why this provider cannot run jobs on this machine now (said at submit), or None."""
        return None

    def refusal(self, section: SectionBase) -> Refusal | None:
        """Why this provider cannot run a job of `section` as the fleet is set up (a private image with no
        login for its registry), said at submit and again before it rents; None, the default: it can."""
        return None

    def volume(self, section: SectionBase) -> tuple[Volume, bool] | None:
        """The volume `section` asks the fleet for (SectionBase.asks_volume), found or made now, and whether
        it was made; the provision stage holds the fleet's lock around it. None: it asks for none."""
        return None

    def volumes(self) -> list[Volume]:
        """The fleet's storage volumes here (`fleet volumes`); none by default."""
        return []

    def delete_volume(self, volume_id: str) -> None:
        """Delete one of the fleet's volumes and its files (NodeError: not the fleet's, or in use)."""
        raise NodeError(f"the {self.name} provider has no storage volumes")

    def reach_advice(self, cause: Unreachable) -> str | None:
        """What of this cloud's settings decides whether its node's TLS check passes, for a run that gives
        up on a node for `cause` (a proxy's authorities or address), or None."""
        return None

    @abstractmethod
    def list_offers(self, section: BaseModel) -> list[Offer]:
        """Offers that fit the section, cheapest first. Never blocks for long."""

    @abstractmethod
    def launch(self, request: LaunchRequest) -> NodeInstance:
        """Create the instance and return at once (it is PENDING). The caller has looked the name up
        first; if the create call fails after the vendor made the instance, the adapter cleans it up or
        returns it, so that exactly one instance of that name exists or none."""

    @abstractmethod
    def get(self, name: str) -> NodeInstance | None:
        """The live instance of that name, or None when it does not exist (or is gone)."""

    @abstractmethod
    def endpoint(self, name: str) -> NodeEndpoint:
        """How to reach the instance's Ray head (raises NodeError when it has none yet)."""

    def software_key(self, name: str) -> str | None:
        """A fingerprint of the software instance `name` trains with, where this provider can tell it without
        the node (a local head: its interpreter, the packages installed beside it, its environment), so a
        readiness check that passed on an earlier node with the same key holds for it (workers.readiness
        remembers it). None, the default, where only a check on the node can tell: a rented node is a new
        machine each time, its image's tag no promise of what is in it."""
        return None

    def endpoint_at(self, name: str, url: str | None) -> NodeEndpoint:
        """How to reach the instance's Ray head at `url`, where an earlier `endpoint` found it (the ledger
        keeps it; None or empty: not known yet, so `endpoint`): an instance's address does not change while it
        lives, so no lookup is needed. By default a provider whose lookups cost nothing looks again."""
        return self.endpoint(name)

    @abstractmethod
    def terminate(self, name: str) -> None:
        """Ask for the instance to be destroyed. A no-op when it is already gone; idempotent. Whether it
        went is `gone`'s to say (a vendor's list may show it a moment longer)."""

    def gone(self, name: str, fresh: bool = False) -> bool:
        """Whether no instance of that name exists; `fresh`: as the vendor says after this call began, not
        as a list kept a moment ago does (providers.listing), where the provider keeps one."""
        return self.get(name) is None

    def forget(self, name: str) -> None:
        """The instance is gone for good: drop what the fleet kept of it here (its token files)."""
        log.debug("%s: nothing kept of %s", self.name, name)

    @abstractmethod
    def list_instances(self) -> list[NodeInstance]:
        """Every live instance of ours (named tf-...); never anybody else's."""

    def ssh_access(self, name: str) -> SshAccess:
        """Where to SSH into the live instance `name` (NodeError saying why not: gone, not up yet, created
        without the fleet's key, or a provider without SSH, as by default)."""
        raise NodeError(f"the {self.name} provider has no SSH into its nodes")

    def jupyter_url(self, name: str) -> str:
        """The URL of the instance's JupyterLab, with its token (never log or store it); NodeError saying
        why there is none."""
        raise NodeError(f"the {self.name} provider runs no JupyterLab on its nodes")

    def pinned_certificate(self, name: str) -> Path | None:
        """The file of the TLS certificate the fleet made for the instance, the only one it trusts there
        (its Jobs API's and JupyterLab's, on a node reached by its address); None when it made none."""
        return None
