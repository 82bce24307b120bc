"""Who may steer the fleet from Discord: allowlists checked in code, fail-closed, plus per-user caps.

Discord's `default_permissions` is a hint a server admin can change; the check that counts is here, run
for every interaction before anything else. An empty allowlist denies everyone; a DM is refused. Each
refusal is written to the event stream as an audit event (`bot.refused`), as is every command that
changes something (`bot.command`). Ids are not secrets; nothing else of the caller is kept.

Stopping a run (/cancel, /terminate of its node) is for its owner, the user who started it from Discord,
and for the admins (`discord_admin_users`, `discord_admin_roles`); `steer_refusal` says why anyone else
may not.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import discord
import redis

from core.errors import NotFound
from core.settings import Settings
from state.cost import DAY_S, HOUR_S, run_cost
from state.events import new_event
from state.keys import bot_run_owner_key, bot_user_runs_key
from state.ledger import Ledger
from state.payloads import PAYLOADS, DiscordOrigin, EventType

# Atomically: forget entries older than a day, refuse when the last hour already holds `cap` entries,
# else add the new one. Two /train at once from one user cannot both slip under the cap.
_RESERVE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[1]) - 86400)
if redis.call('ZCOUNT', KEYS[1], tonumber(ARGV[1]) - 3600, '+inf') >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[3])
redis.call('EXPIRE', KEYS[1], 90000)
return 1
"""


@dataclass(frozen=True)
class Caller:
    """Who sent an interaction, and from where (ids only)."""

    user_id: int
    role_ids: frozenset[int]
    channel_id: int | None
    guild_id: int | None

    @classmethod
    def of(cls, interaction: discord.Interaction[Any]) -> Caller:
        user = interaction.user
        # The role ids as the interaction carries them. `Member.roles` would look each one up in the guild's
        # role cache, which a bot without the guilds intent (this one) never fills: the check would see none.
        roles = frozenset(int(r) for r in user._roles) if isinstance(user, discord.Member) else frozenset()
        return cls(user.id, roles, interaction.channel_id, interaction.guild_id)

    def origin(self) -> DiscordOrigin:
        """The caller as the runs they start record them (what bounds those runs: service.runs)."""
        return DiscordOrigin(user_id=str(self.user_id), role_ids=tuple(str(r) for r in sorted(self.role_ids)))

    def audit(self) -> dict[str, Any]:
        """The caller as an audit event records it."""
        return {
            "user_id": str(self.user_id),
            "channel_id": str(self.channel_id) if self.channel_id else None,
            "guild_id": str(self.guild_id) if self.guild_id else None,
        }


def refusal(settings: Settings, caller: Caller) -> str | None:
    """Why `caller` may not use the bot, or None when they may. Fail-closed: empty lists allow nobody."""
    if caller.guild_id is None:
        return "the fleet bot takes no commands in direct messages; use it in the fleet's channel"
    if caller.channel_id not in settings.discord_allowed_channels:
        return "the fleet bot does not take commands in this channel"
    if caller.user_id in settings.discord_allowed_users:
        return None
    if caller.role_ids & set(settings.discord_allowed_roles):
        return None
    return "you are not on the fleet bot's allowlist (by user or by role); ask the fleet's admin"


def is_admin(settings: Settings, caller: Caller) -> bool:
    """Whether `caller` is one of the fleet's Discord admins (by user id or by role)."""
    return caller.user_id in settings.discord_admin_users or bool(
        caller.role_ids & set(settings.discord_admin_roles)
    )


def steer_refusal(settings: Settings, caller: Caller, owner: int | None, what: str) -> str | None:
    """Why `caller` may not cancel or terminate `what` (a run, or a run's node), or None when they may: its
    owner (who started it with /train or /sweep) and the admins may. A run started by the CLI or the git
    trigger has no Discord owner: only an admin may stop it from Discord."""
    if caller.user_id == owner or is_admin(settings, caller):
        return None
    if owner is None:
        return f"{what} was not started from Discord; only a fleet admin may stop it here (or use the CLI)"
    return f"{what} was started by another user; only they or a fleet admin may stop it"


def audit(ledger: Ledger, event_type: EventType, caller: Caller, data: dict[str, Any]) -> None:
    """Write one audit event (a refusal or a command) to the event stream."""
    ledger.emit(new_event(PAYLOADS[event_type].model_validate({**caller.audit(), **data})))


@dataclass(frozen=True)
class Usage:
    """A user's runs in the last hour and what their runs of the last day cost, against the caps."""

    runs_last_hour: int
    runs_per_hour: int
    spent_today: float
    dollars_per_day: float


class Caps:
    """Per-user caps on /train: runs per hour and dollars per (rolling) day, kept in Redis."""

    def __init__(self, client: redis.Redis[str], ledger: Ledger, settings: Settings) -> None:
        self.client, self.ledger, self.settings = client, ledger, settings
        self._reserve = client.register_script(_RESERVE)

    def usage(self, user_id: int, now: float | None = None) -> Usage:
        now = time.time() if now is None else now
        key = bot_user_runs_key(user_id)
        recent = self.client.zcount(key, now - HOUR_S, "+inf")
        spent = 0.0
        for member in self.client.zrangebyscore(key, now - DAY_S, "+inf"):
            try:
                spent += run_cost(self.ledger, self.ledger.get_run(member), now)
            except NotFound:
                continue  # a reservation in flight, or a run removed from the ledger
        return Usage(
            recent, self.settings.bot_runs_per_hour, round(spent, 4), self.settings.bot_dollars_per_day
        )

    def reserve(self, user_id: int) -> tuple[str | None, str | None]:
        """(a reservation, None) when the user may start one more run now, else (None, why not).
        Turn the reservation into the run with `confirm`, or give it back with `release`."""
        usage = self.usage(user_id)
        if usage.spent_today >= usage.dollars_per_day:
            return None, (
                f"your runs cost ${usage.spent_today:.2f} in the last 24 h; the cap is "
                f"${usage.dollars_per_day:.2f} a day"
            )
        token = f"pending-{uuid.uuid4().hex}"
        cap = self.settings.bot_runs_per_hour
        if not self._reserve(keys=[bot_user_runs_key(user_id)], args=[time.time(), cap, token]):
            return None, f"you started {cap} runs in the last hour; the cap is {cap} an hour"
        return token, None

    def confirm(self, user_id: int, token: str, run_id: str) -> None:
        with self.client.pipeline(transaction=True) as pipe:
            pipe.zrem(bot_user_runs_key(user_id), token)
            pipe.zadd(bot_user_runs_key(user_id), {run_id: time.time()})
            pipe.set(bot_run_owner_key(run_id), str(user_id))
            pipe.execute()

    def owner(self, run_id: str) -> int | None:
        """The Discord user who started the run with /train or /sweep (None: started elsewhere)."""
        found = self.client.get(bot_run_owner_key(run_id))
        return int(found) if found else None

    def release(self, user_id: int, token: str) -> None:
        self.client.zrem(bot_user_runs_key(user_id), token)

    def reserve_runs(self, user_id: int, count: int) -> tuple[list[str] | None, str | None]:
        """`count` reservations, all or none: (the reservations, None), or (None, why not) with any taken
        already given back. A sweep counts as one run per child."""
        tokens: list[str] = []
        for _ in range(count):
            token, why = self.reserve(user_id)
            if token is None:
                self.release_runs(user_id, tokens)
                return None, why
            tokens.append(token)
        return tokens, None

    def confirm_runs(self, user_id: int, tokens: list[str], run_ids: list[str]) -> None:
        """Each reservation becomes its run (in order)."""
        for token, run_id in zip(tokens, run_ids, strict=True):
            self.confirm(user_id, token, run_id)

    def release_runs(self, user_id: int, tokens: list[str]) -> None:
        for token in tokens:
            self.release(user_id, token)
