"""The bot's slash commands: the same service functions as the CLI, behind the access check.

`FleetTree` holds them. `FleetTree.interaction_check` runs for every command and every autocomplete before
anything else (before any defer): a refused caller gets an ephemeral reason (or no choices), and an audit
event is written. Replies are embeds; errors are ephemeral and say what to fix, with `fleet validate`'s
messages for a YAML. The commands themselves are in bot/commands_submit.py (/train, /sweep),
bot/commands_runs.py (/status, /runs, /logs, /cancel) and bot/commands_nodes.py (/instances, /terminate,
/budget, /jupyter).
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import discord
from discord import app_commands
from discord.types.embed import Embed as EmbedData

from bot.access import Caller, Caps, audit, refusal, steer_refusal
from bot.commands_nodes import register_nodes
from bot.commands_runs import register_runs
from bot.commands_submit import register_submit
from bot.render import Scrubber, fit_embed
from bot.replies import ERROR_COLOUR, plain_embed
from core.errors import FleetError
from service.runs import Fleet
from state.payloads import EventType

log = logging.getLogger(__name__)
T = TypeVar("T")


class FleetTree(app_commands.CommandTree[discord.Client]):
    """The command tree, with the access check in front of every command and autocomplete."""

    def __init__(self, client: discord.Client, fleet: Fleet, secret_values: list[str]) -> None:
        super().__init__(client)
        self.fleet = fleet
        self.scrub = Scrubber(secret_values)
        self.caps = Caps(fleet.redis, fleet.ledger, fleet.settings)
        register(self)

    async def interaction_check(self, interaction: discord.Interaction[Any], /) -> bool:
        caller = Caller.of(interaction)
        why = refusal(self.fleet.settings, caller)
        if why is None:
            return True
        name = interaction.data.get("name") if interaction.data else None
        kind = "autocomplete" if interaction.type == discord.InteractionType.autocomplete else "command"
        await self.audit(EventType.BOT_REFUSED, caller, command=name, kind=kind, reason=why)
        if kind == "autocomplete":
            await interaction.response.autocomplete([])
        else:
            await self.refuse(interaction, "Refused", why)
        return False

    async def on_error(
        self, interaction: discord.Interaction[Any], error: app_commands.AppCommandError
    ) -> None:
        cause = error.original if isinstance(error, app_commands.CommandInvokeError) else error
        if isinstance(cause, FleetError):
            await self.refuse(interaction, "Cannot do that", str(cause))
            return
        log.error("command %s failed", interaction.command and interaction.command.name, exc_info=cause)
        await self.refuse(
            interaction, "Internal error", "the command failed; the fleet's log has the details"
        )

    async def say(
        self,
        interaction: discord.Interaction[Any],
        embed: EmbedData,
        ephemeral: bool = False,
        attach: tuple[str, str] | None = None,
    ) -> None:
        """Answer with an embed (scrubbed, cut to Discord's limits), or follow up when the interaction was
        already answered (deferred); `attach` (file name, text) goes with it as a file, scrubbed too."""
        fitted = discord.Embed.from_dict(fit_embed(self.scrub.deep(embed)))
        files = []
        if attach is not None:
            name, text = attach
            files.append(discord.File(io.BytesIO(self.scrub(text).encode()), filename=name))
        if interaction.response.is_done():
            await interaction.followup.send(embed=fitted, ephemeral=ephemeral, files=files)
        else:
            await interaction.response.send_message(embed=fitted, ephemeral=ephemeral, files=files)

    async def refuse(self, interaction: discord.Interaction[Any], title: str, text: str) -> None:
        """An error: private to the caller, saying what to fix."""
        await self.say(interaction, plain_embed(title, text, ERROR_COLOUR), ephemeral=True)

    async def may_stop(self, interaction: discord.Interaction[Any], run_id: str | None, what: str) -> bool:
        """Whether the caller may cancel or terminate `what` (of run `run_id`; None: of no run we know):
        its Discord owner or an admin. Anyone else is answered privately and audited (`bot.refused`, kind
        `owner`), and nothing is done."""
        caller = Caller.of(interaction)
        owner = await self.run(self.caps.owner, run_id) if run_id else None
        why = steer_refusal(self.fleet.settings, caller, owner, what)
        if why is None:
            return True
        name = interaction.data.get("name") if interaction.data else None
        await self.audit(EventType.BOT_REFUSED, caller, command=name, kind="owner", reason=why)
        await self.refuse(interaction, "Not your run", why)
        return False

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """A blocking service call, off the event loop."""
        return await asyncio.to_thread(fn, *args)

    async def audit(self, event_type: EventType, caller: Caller, **data: Any) -> None:
        await self.run(audit, self.fleet.ledger, event_type, caller, data)


def register(tree: FleetTree) -> None:
    """Add the fleet's commands to `tree`."""
    register_submit(tree)
    register_runs(tree)
    register_nodes(tree)
