"""A sweep's events and its table; and the bot's audit trail (who did what)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from state.payloads.base import EventType, Payload


class SweepRow(BaseModel):
    """One child of a sweep in its table: the values the sweep set, and its final metric."""

    model_config = ConfigDict(extra="forbid")

    index: int
    run_id: str
    state: str
    params: dict[str, JsonValue] = Field(default_factory=dict)
    metric: int | float | None = None
    best: bool = False


class SweepStarted(Payload):
    type = EventType.SWEEP_STARTED
    sweep_id: str
    source: str
    runs: list[str]
    keys: list[str]
    max_parallel: int


class SweepSummary(BaseModel):
    """A sweep's state and its table: what its last event and its status views show."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sweep_id: str
    state: str
    source: str
    metric: str
    goal: str
    keys: list[str]
    rows: list[SweepRow]

    @property
    def best(self) -> SweepRow | None:
        return next((row for row in self.rows if row.best), None)


class SweepFinished(SweepSummary, Payload):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type = EventType.SWEEP_FINISHED


# The bot's audit trail


class BotAudit(Payload):
    """Who did it (Discord ids as text) and what."""

    user_id: str
    channel_id: str | None = None
    guild_id: str | None = None
    command: str


class BotRefused(BotAudit):
    type = EventType.BOT_REFUSED
    kind: str
    reason: str


class BotCommand(BotAudit):
    type = EventType.BOT_COMMAND
    run_id: str | None = None
    sweep_id: str | None = None
    instance: str | None = None
    force: bool | None = None
