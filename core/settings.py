"""The fleet's settings: one object, built once per process from the environment and an optional file.

Environment variables are `FLEET_<NAME>` (plus `REDIS_URL` as is). A settings file (YAML) may hold the
same names in lower case; it is read from `FLEET_SETTINGS_FILE`, else `<config dir>/settings.yml` when
that exists. The environment wins over the file. Nothing reads the environment at import time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import platformdirs
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from core import redisurl
from core.errors import ConfigError, Problem
from core.policy_settings import PolicySettings

MIN_HEARTBEAT_TIMEOUT_S = 60  # a node's failsafe waits at least this long for the fleet's heartbeat

# How long a call to a node's Jobs API or a provider's API may wait (the settings' defaults): to connect,
# for an answer, and for the answer to an upload of a job's files (a large working_dir).
API_CONNECT_TIMEOUT_S = 10.0
NODE_API_TIMEOUT_S = 60.0
PROVIDER_API_TIMEOUT_S = 60.0
UPLOAD_TIMEOUT_S = 900.0


class Settings(PolicySettings):
    """Every knob of the fleet (the node's own in core.node_settings, who may do what in
    core.policy_settings). See docs/ARCHITECTURE.md for how they are used. Strict and frozen as NodeSettings
    is (its model_config)."""

    redis_url: str | None = Field(
        None,
        description="Redis for the broker, ledger and events (redis://:password@host:port/db, rediss://, "
        "unix:///path.sock?db=0, or redis+sentinel://[:password@]host:port[,host:port]/master[/db]; a "
        "secret: its password is never shown); unset: the embedded redis-server on a unix socket.",
    )
    home: Path = Field(
        default_factory=lambda: Path(platformdirs.user_data_dir("trainfleet")),
        description="Where the fleet keeps its data: embedded Redis, run directories, local nodes.",
    )
    runs_dir: Path = Field(
        default_factory=lambda data: Path(data["home"]) / "runs",
        description="The run directories (job files, shipped files, results); unset: <home>/runs. Workers "
        "on several machines share one (NFS, a volume), mounted at the same path on each.",
    )
    default_provider: str = Field("local", description="Provider of a job without a provider section.")
    providers: tuple[str, ...] | None = Field(
        None,
        description="The providers this fleet runs jobs on (comma-separated); a job for another is refused "
        "at submit; unset: every provider the fleet has. docker-compose names the clouds: a local Ray head "
        "in a worker's container is out of the other stages' reach.",
    )
    hf_endpoint: str = Field(
        "https://huggingface.co", description="The Hugging Face Hub (HF_ENDPOINT; a fake's URL in tests)."
    )
    hf_hub_disable_xet: bool = Field(
        False, description="Plain HTTP/LFS transfers instead of Xet (HF_HUB_DISABLE_XET; the fake needs it)."
    )
    wandb_mode: Literal["online", "offline", "disabled"] = Field(
        "online", description="W&B mode of jobs that name a wandb_project and no wandb_mode (WANDB_MODE)."
    )
    wandb_entity: str | None = Field(None, description="W&B entity of jobs that name none (WANDB_ENTITY).")
    wandb_base_url: str = Field(
        "https://api.wandb.ai",
        description="W&B's API (WANDB_BASE_URL): a W&B Server's, or a fake's in tests; nodes get it too.",
    )
    wandb_app_url: str | None = Field(
        None,
        description="Where W&B run pages live; unset: from wandb_base_url, as the wandb client derives it.",
    )
    train_restarts: int = Field(
        2, ge=0, le=20, description="Times a killed or crashed train job is run again (from its checkpoint)."
    )
    train_pending_s: float = Field(
        600,
        gt=0,
        le=86400,
        description="How long a Ray train job waits for room for its workers before the run fails "
        "RESOURCES_UNAVAILABLE (sent to the node as FLEET_TRAIN_PENDING_S; a job file cannot set it).",
    )
    poll_interval_s: float = Field(1.0, gt=0, le=60, description="Delay between polls of a node or job.")
    park_max_s: float = Field(
        300, gt=0, description="A run waiting on its node (parked) gets its stage task at least this often."
    )
    node_ready_timeout_s: float = Field(300, gt=0, description="Give up when a node is not ready by then.")
    node_tls_fail_after_s: float = Field(
        30,
        gt=0,
        description="Give up on a starting node whose TLS certificate fails the fleet's check (untrusted, "
        "for another name, not the pinned one) this long: NODE_UNREACHABLE, naming it (no wait heals it).",
    )
    stall_after_s: float = Field(60, gt=0, description="Re-send a run's stage task when none ran this long.")
    stalled_after_kicks: int = Field(
        3,
        ge=1,
        le=100,
        description="A run whose re-sent stage task died this often without ending a step fails STALLED.",
    )
    retry_for_s: float = Field(
        1800,
        ge=0,
        description="A step failing with errors that may pass is retried this long (from its "
        "first failure) at most, then the run fails with the error.",
    )
    provision_time_limit_s: float = Field(
        900, gt=0, le=3600, description="Soft time limit of one provision task (a step past it is retried)."
    )
    prepare_time_limit_s: float = Field(
        1200, gt=0, le=3600, description="Soft time limit of one prepare task (uploads the job's files)."
    )
    train_time_limit_s: float = Field(
        1200,
        gt=0,
        le=3600,
        description="Soft time limit of one train task (a submit and its upload, a poll).",
    )
    finalize_time_limit_s: float = Field(
        1800, gt=0, le=3600, description="Soft time limit of one finalize task (results back, unpacked)."
    )
    reap_time_limit_s: float = Field(600, gt=0, le=3600, description="Soft time limit of one reaper pass.")
    time_limit_grace_s: float = Field(
        60, ge=1, le=600, description="A task still running this long after its soft time limit is killed."
    )
    api_connect_timeout_s: float = Field(
        API_CONNECT_TIMEOUT_S, gt=0, le=300, description="Connect timeout of a node's or provider's API call."
    )
    node_api_timeout_s: float = Field(
        NODE_API_TIMEOUT_S, gt=0, le=3600, description="Read timeout of a call to a node's Jobs API."
    )
    provider_api_timeout_s: float = Field(
        PROVIDER_API_TIMEOUT_S, gt=0, le=3600, description="Read timeout of a call to a provider's API."
    )
    provider_list_max_age_s: float = Field(
        1.0,
        ge=0,
        le=60,
        description="How old a provider's instance list the fleet's processes share may be: one list call "
        "per provider per this long, whatever the number of runs; 0: every look asks the provider.",
    )
    upload_timeout_s: float = Field(
        UPLOAD_TIMEOUT_S, gt=0, le=86400, description="Read timeout of the upload of a job's files to a node."
    )
    reap_interval_s: float = Field(30, gt=0, description="How often the reaper runs (celery beat).")
    node_heartbeat_timeout_s: float | None = Field(
        1800,
        description="A rented node gives itself back when the fleet has not called it for this long (its "
        "failsafe); 0: never. At least 60 s, and 3 reaper intervals (the reaper pings the nodes it keeps).",
    )
    orphan_grace_s: float = Field(120, ge=0, description="Never reap an instance younger than this.")
    idle_stop_after_s: int = Field(
        900, ge=-1, description="stop_after of jobs whose section has none (local): idle this long, ended."
    )
    idle_gpu_util_pct: float = Field(
        5.0, ge=0, le=100, description="A node whose GPUs are busier than this (%) is not idle."
    )
    kept_reminder_s: float = Field(
        900, ge=0, description="A kept instance's reminder event comes this long before it ends."
    )
    terminate_retry_max_s: float = Field(
        300, gt=0, description="Longest back-off between terminate calls to an instance that stays listed."
    )
    stuck_alert_after_s: float = Field(
        120, ge=0, description="An instance still listed this long after its terminate: alert every cycle."
    )
    create_settle_s: float = Field(
        120, ge=0, description="After a create call without a clear answer, look the name up this long first."
    )
    lost_after_misses: int = Field(
        3, ge=1, le=100, description="Looks in a row without it in the provider's list before a node is LOST."
    )
    stopped_node_wait_s: float = Field(
        60,
        ge=0,
        le=3600,
        description="After a trainer told its machine is going kept a checkpoint and ended, how long train "
        "waits for the provider to say the machine is gone before it runs the job again on it.",
    )
    max_preemptions: int = Field(
        5, ge=0, le=100, description="Lost (preempted) nodes a run replaces before it fails INSTANCE_LOST."
    )
    preempt_backoff_s: float = Field(
        10, ge=0, le=3600, description="Wait before the first replacement node; doubles, at most 10 min."
    )
    events_maxlen: int = Field(100_000, ge=1000, description="Approximate cap of the global event stream.")
    discord_webhook_url: str | None = Field(
        None, description="The notifier's Discord webhook (a secret: its token is in the URL path)."
    )
    discord_api_base: str = Field(
        "https://discord.com/api/v10", description="Discord's REST API; set only to point at a fake."
    )
    discord_channel_id: int | None = Field(
        None, description="The channel the bot posts the fleet's events to (with FLEET_DISCORD_BOT_TOKEN)."
    )
    discord_guild_id: int | None = Field(
        None, description="Register the bot's slash commands in this server only (instant); unset: global."
    )
    discord_allowed_users: tuple[int, ...] = Field(
        (), description="User ids allowed to use the bot (comma-separated); empty, with no roles: nobody."
    )
    discord_allowed_roles: tuple[int, ...] = Field(
        (), description="Role ids whose members may use the bot (comma-separated)."
    )
    discord_allowed_channels: tuple[int, ...] = Field(
        (), description="Channel ids the bot answers in (comma-separated); empty: none."
    )
    discord_admin_users: tuple[int, ...] = Field(
        (), description="User ids (also allowlisted) who may cancel or terminate anyone's run from Discord."
    )
    discord_admin_roles: tuple[int, ...] = Field(
        (), description="Role ids whose (allowlisted) members may cancel or terminate anyone's run."
    )
    bot_runs_per_hour: int = Field(5, ge=0, description="Runs one Discord user may start per hour.")
    bot_configs_dir: Path = Field(
        Path("configs"),
        description="Where /train finds configs by name; relative dataset paths of an "
        "attached YAML are looked up here too (and allowed only under data_roots).",
    )
    data_roots: tuple[Path, ...] = Field(
        (),
        description="Absolute directories (os.pathsep-separated) whose files any job may name besides those "
        "under its own directory; the only ones a Discord attachment may name. Empty: none.",
    )
    worker_concurrency: int = Field(2, ge=1, le=64, description="Processes of a worker started by the CLI.")

    @field_validator(
        "discord_allowed_users",
        "discord_allowed_roles",
        "discord_allowed_channels",
        "discord_admin_users",
        "discord_admin_roles",
        "providers",
        mode="before",
    )
    @classmethod
    def _id_list(cls, value: Any) -> Any:
        """Ids from the environment come as one comma-separated string."""
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        if isinstance(value, int):
            return (value,)
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        """A URL redis-py and Celery both take; empty: the embedded Redis. The message never quotes the URL
        (its password)."""
        if not value:
            return None
        redisurl.check(value)
        return value

    @field_validator("node_heartbeat_timeout_s")
    @classmethod
    def _heartbeat_timeout(cls, value: float | None, info: ValidationInfo) -> float | None:
        """0 turns the heartbeat off. Otherwise a node must survive a boot and the gaps between the
        reaper's pings, which are a node's only heartbeat while no stage polls it."""
        if not value:
            return None
        floor = max(MIN_HEARTBEAT_TIMEOUT_S, 3 * info.data.get("reap_interval_s", 30))
        if value < floor:
            raise ValueError(f"must be 0 (off) or at least {floor:g} s (60 s, and three reap_interval_s)")
        return value

    @field_validator("data_roots", mode="before")
    @classmethod
    def _data_roots(cls, value: Any) -> Any:
        """From the environment: one os.pathsep-separated string. Each root must be absolute."""
        if isinstance(value, str | Path):
            value = [part for part in str(value).split(os.pathsep) if part.strip()]
        if isinstance(value, list | tuple):
            relative = [str(part) for part in value if not Path(str(part)).is_absolute()]
            if relative:
                raise ValueError(f"each data root must be an absolute directory; not {', '.join(relative)}")
        return value

    @property
    def provider_api_timeouts(self) -> tuple[float, float]:
        """requests' (connect, read) timeout of a provider API call."""
        return self.api_connect_timeout_s, self.provider_api_timeout_s

    @property
    def nodes_dir(self) -> Path:
        return self.home / "nodes"

    @property
    def cache_dir(self) -> Path:
        return self.home / "cache"

    def public(self) -> dict[str, Any]:
        """Settings safe to show (URLs may hold passwords: only their presence is shown)."""
        data = self.model_dump(mode="json")
        if data.get("redis_url"):
            data["redis_url"] = "<set>"
        if data.get("discord_webhook_url"):
            data["discord_webhook_url"] = "<set>"
        return data


S = TypeVar("S", bound=Settings)


class CloudSettings(BaseModel):
    """A cloud's own settings (its API's URL, how its nodes are reached), declared in its package
    (providers/<cloud>/settings.py). The fleet's settings class derives from Settings and every registered
    cloud's (providers.registry.FleetSettings), so they are read as every other knob: `FLEET_<NAME>`, the
    settings file, and the vendor's own variable for the fields in `AS_IS`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    AS_IS: ClassVar[Mapping[str, str]] = {}
    """Fields also read from the environment under the vendor's own name (its API's URL variable)."""
    API_URL: ClassVar[str | None] = None
    """The field that holds the cloud's API base URL (None: it has none)."""

    def api_url(self) -> str | None:
        """The cloud's API base URL as set (else its default), or None."""
        return None if self.API_URL is None else str(getattr(self, self.API_URL))


# Settings also read from the environment under the name their own tools use.
AS_IS = {
    "redis_url": "REDIS_URL",
    "hf_endpoint": "HF_ENDPOINT",
    "hf_hub_disable_xet": "HF_HUB_DISABLE_XET",
    "wandb_mode": "WANDB_MODE",
    "wandb_entity": "WANDB_ENTITY",
    "wandb_base_url": "WANDB_BASE_URL",
}


def _file_values(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(str(path), [Problem("", f"cannot read settings file: {exc}")]) from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), [Problem("", "a settings file must be a mapping of names to values")])
    return {str(k): v for k, v in data.items()}


def config_dir() -> Path:
    """The fleet's configuration directory (its default settings and secrets files)."""
    return Path(platformdirs.user_config_dir("trainfleet"))


def settings_file(env: dict[str, str] | None = None) -> Path:
    """The settings file: FLEET_SETTINGS_FILE, else settings.yml in the configuration directory."""
    explicit = (os.environ if env is None else env).get("FLEET_SETTINGS_FILE")
    return Path(explicit) if explicit else config_dir() / "settings.yml"


def vendor_names(model: type[Settings]) -> dict[str, str]:
    """The settings of `model` read under their own tool's variable (REDIS_URL, RUNPOD_API_BASE_URL): the
    fleet's and each cloud's it derives from."""
    clouds = [base.AS_IS for base in model.__mro__ if issubclass(base, CloudSettings)]
    return {k: v for names in (AS_IS, *clouds) for k, v in names.items()}


def load_settings(env: dict[str, str] | None = None, model: type[S] = Settings) -> S:  # type: ignore[assignment]
    """Build the settings from a file (if any) and the environment; raise ConfigError when invalid.
    `model`: the fleet's settings class with its clouds' (providers.registry.FleetSettings)."""
    environ = dict(os.environ if env is None else env)
    explicit = environ.get("FLEET_SETTINGS_FILE")
    path = settings_file(environ)
    values: dict[str, Any] = {}
    if explicit or path.exists():
        values = _file_values(path)
    as_is = vendor_names(model)
    for name in model.model_fields:
        for key in (f"FLEET_{name.upper()}", as_is.get(name)):
            if key and key in environ:
                values[name] = environ[key]  # the vendor's own name (AS_IS) wins over FLEET_*
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        problems = [Problem(".".join(str(p) for p in e["loc"]), e["msg"]) for e in exc.errors()]
        raise ConfigError("settings", problems) from None
