"""Who may do what with the fleet: the settings that bound a job by who submitted it.

A job comes from the CLI (the fleet's owner, at this machine), from Discord (an allowlisted user) or from
the git trigger (a committer to a watched repository). The owner's CLI may do anything the fleet can; a
Discord user or a committer gets what the operator grants here and nothing more:
- `local_jobs_from`: who may run a job on this machine (the local provider): its code then runs here;
- `local_sandbox`, `local_node_uid`: how a local node is kept from the fleet's processes and files
  (providers.local.sandbox);
- `hub_namespaces`: where on the Hugging Face Hub a job may push with the fleet's HF token;
- the money a run, a submitter and the whole fleet may spend: `max_dollars_per_run`, `bot_dollars_per_day`
  (each Discord user), `git_dollars_per_day` (each watched repository), `max_dollars_per_day` (the fleet).
  Each is checked against the worst case of what is asked, at submit and again at provision
  (state.budget), and against what was spent, by the stages and the reaper (workers.budget).
core.settings.Settings derives from PolicySettings: one flat settings file and `FLEET_<NAME>` variables, as
for every other knob.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from core.node_settings import NodeSettings

ANY_NAMESPACE = "*"  # in hub_namespaces: any namespace the fleet's HF token may write
# A run's default cap: a job with the sections' defaults (1 GPU at max_bid_per_gpu $2 for terminate_after's
# 24 h: $48) fits under it; one that may cost more says how long it runs, or the operator raises the cap.
DEFAULT_DOLLARS_PER_RUN = 50.0


class Source(StrEnum):
    """Where a job came from."""

    CLI = "cli"  # `fleet run`, `fleet enqueue`, `fleet sweep`: the fleet's owner
    DISCORD = "discord"  # /train, /sweep
    GIT = "git"  # `fleet watch`, `fleet enqueue --changed-since`


@dataclass(frozen=True)
class Submitter:
    """Who submitted a job, as the operator's allow-lists name them: `names` holds the source alone
    (`discord`, any allowlisted Discord user) and then each narrower name (`discord:user:<id>`,
    `discord:role:<id>`, `git:<repo id>`); a grant to any of them is theirs."""

    source: Source
    names: tuple[str, ...]

    @classmethod
    def cli(cls) -> Submitter:
        return cls(Source.CLI, (Source.CLI.value,))

    @classmethod
    def discord(cls, user_id: int | str, role_ids: tuple[int | str, ...] = ()) -> Submitter:
        roles = tuple(f"discord:role:{r}" for r in role_ids)
        return cls(Source.DISCORD, ("discord", f"discord:user:{user_id}", *roles))

    @classmethod
    def git(cls, repo_id: str) -> Submitter:
        return cls(Source.GIT, ("git", f"git:{repo_id}"))

    def __str__(self) -> str:
        return self.names[1] if len(self.names) > 1 else self.names[0]


class PolicySettings(NodeSettings):
    """The policy side of the fleet's settings (see the module's notes)."""

    local_jobs_from: tuple[Source, ...] = Field(
        (Source.CLI,),
        description="Who may submit jobs that run on this machine (the local provider; comma-separated: "
        "cli, discord, git): such a job's code runs here. Default: the CLI only.",
    )
    local_sandbox: Literal["auto", "bwrap", "none"] = Field(
        "auto",
        description="How a local node is kept from the fleet: bwrap (bubblewrap: its own pid, IPC and mount "
        "namespaces, the fleet's files out of sight, and its own uid when the fleet runs as root); none: "
        "as the fleet itself (only for jobs you wrote); auto: bwrap, or no local node without it.",
    )
    local_node_uid: int = Field(
        65533,
        ge=1,
        le=2**31 - 2,
        description="The uid (and gid) a sandboxed local node runs as when the fleet runs as root: one of "
        "its own, owning no file of the fleet's.",
    )
    hub_namespaces: dict[str, tuple[str, ...]] = Field(
        default_factory=dict,
        description="Where each submitter's jobs may push on the Hub with the fleet's HF token: a mapping "
        "(JSON in the environment) from `cli`, `discord`, `discord:user:<id>`, `discord:role:<id>`, `git` or "
        "`git:<repo id>` to namespaces (`*`: any the token writes). Unlisted: nowhere, but the CLI (the "
        "fleet's owner) anywhere unless `cli` is listed.",
    )

    max_dollars_per_run: float | None = Field(
        DEFAULT_DOLLARS_PER_RUN,
        gt=0,
        description="The most one run may cost. A run whose worst case (its nodes x GPUs x max_bid_per_gpu x "
        "terminate_after) is more is refused at submit and at provision; a run whose nodes cost this much "
        "is stopped (OVER_BUDGET, its results and checkpoints brought back first). It is also the bound of "
        "a run with terminate_after: -1. 0: no cap.",
    )
    max_dollars_per_day: float | None = Field(
        None,
        gt=0,
        description="The most the fleet's nodes may cost in a rolling day: a run is refused (at submit and "
        "at provision) when the worst case of the runs not ended, plus what was spent in the last 24 h, "
        "plus its own would pass it; once spent, the reaper stops the runs that still spend. Unset: no cap.",
    )
    bot_dollars_per_day: float = Field(
        50.0,
        ge=0,
        description="The same cap for each Discord user's runs (/train, /sweep), counted as the fleet's is.",
    )
    git_dollars_per_day: float | None = Field(
        50.0,
        ge=0,
        description="The same cap for the runs of each watched git repository (`fleet watch`, `fleet "
        "enqueue --changed-since`); empty: none of its own.",
    )

    @field_validator("max_dollars_per_run", "git_dollars_per_day", mode="before")
    @classmethod
    def _no_cap(cls, value: Any, info: ValidationInfo) -> Any:
        """Empty turns a cap off; so does 0 for the per-run cap (no run could start under a cap of $0)."""
        if isinstance(value, str) and not value.strip():
            return None
        if info.field_name == "max_dollars_per_run" and value in (0, "0"):
            return None
        return value

    @field_validator("local_jobs_from", mode="before")
    @classmethod
    def _sources(cls, value: Any) -> Any:
        """From the environment: one comma-separated string."""
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("hub_namespaces", mode="before")
    @classmethod
    def _namespaces(cls, value: Any) -> Any:
        """From the environment: JSON. Each key must name a submitter as the module's notes say."""
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except ValueError as exc:
                raise ValueError(f"must be a JSON object of submitter to namespaces ({exc})") from None
        if isinstance(value, dict):
            bad = [str(k) for k in value if not _submitter_name(str(k))]
            if bad:
                raise ValueError(
                    f"unknown submitter {', '.join(bad)}: use cli, discord, discord:user:<id>, "
                    "discord:role:<id>, git or git:<repo id>"
                )
            value = {str(k): [v] if isinstance(v, str) else v for k, v in value.items()}
        return value

    def may_run_here(self, submitter: Submitter) -> bool:
        """Whether `submitter`'s jobs may run on this machine (the local provider)."""
        return submitter.source in self.local_jobs_from

    def dollars_per_day_of(self, submitter: Submitter) -> tuple[float, str] | None:
        """The cap on what `submitter`'s runs may cost in a rolling day, and the variable that sets it; None
        for the CLI, the fleet's owner, whom the fleet's own cap bounds."""
        if submitter.source is Source.DISCORD:
            return self.bot_dollars_per_day, "FLEET_BOT_DOLLARS_PER_DAY"
        if submitter.source is Source.GIT and self.git_dollars_per_day is not None:
            return self.git_dollars_per_day, "FLEET_GIT_DOLLARS_PER_DAY"
        return None

    def hub_grant(self, submitter: Submitter) -> tuple[str, ...]:
        """The namespaces `submitter`'s jobs may push to (ANY_NAMESPACE: any the token writes)."""
        if submitter.source is Source.CLI and Source.CLI.value not in self.hub_namespaces:
            return (ANY_NAMESPACE,)
        found: list[str] = []
        for name in submitter.names:
            found += [n for n in self.hub_namespaces.get(name, ()) if n not in found]
        return tuple(found)


def _submitter_name(name: str) -> bool:
    if name in (Source.CLI.value, Source.DISCORD.value, Source.GIT.value):
        return True
    kind, _, rest = name.partition(":")
    if kind == "discord":
        what, _, ident = rest.partition(":")
        return what in ("user", "role") and ident.isdigit()
    return kind == "git" and bool(rest)
