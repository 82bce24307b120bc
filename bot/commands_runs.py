"""/status, /runs, /logs and /cancel: the fleet's runs, one or the newest, and stopping one.

What /status, /runs and /logs answer is seen by the caller alone (an ephemeral answer) unless they pass
`public: true`: a run's name, config and events are the business of the channel only when someone shares
them. /cancel is for the run's owner and the admins (FleetTree.may_stop)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import discord
from discord import app_commands

from bot.access import Caller
from bot.render import DESCRIPTION_MAX, status_embed
from bot.replies import CHOICES_MAX, plain_embed
from service import runs as svc
from service.describe import describe
from state import events, nodelogs
from state.cost import run_cost
from state.models import Run
from state.payloads import EventType

if TYPE_CHECKING:
    from bot.commands import FleetTree

LOG_LINES = 25
NODE_LOG_TAIL = 1_000_000  # characters of what the node printed that /logs attaches (its end)
PUBLIC_HELP = "Show the answer to the channel (default: only you see it)."


def register_runs(tree: FleetTree) -> None:
    """Add the run commands to `tree`."""
    fleet = tree.fleet

    async def runs_choices(
        interaction: discord.Interaction[Any], current: str
    ) -> list[app_commands.Choice[str]]:
        runs = await tree.run(fleet.ledger.list_runs, 100)
        found = [r for r in runs if r.run_id.startswith(current)][:CHOICES_MAX]
        return [app_commands.Choice(name=f"{r.run_id} {r.state.value}", value=r.run_id) for r in found]

    @tree.command(name="status", description="One run's status (the newest run when none is named).")
    @app_commands.describe(run="A run id (or a unique prefix).", public=PUBLIC_HELP)
    @app_commands.autocomplete(run=runs_choices)
    async def status(
        interaction: discord.Interaction[Any], run: str | None = None, public: bool = False
    ) -> None:
        if run is None:
            newest = await tree.run(fleet.ledger.list_runs, 1)
            if not newest:
                embed = plain_embed("No runs yet", "start one with /train")
                await tree.say(interaction, embed, ephemeral=not public)
                return
            found = newest[0]
        else:
            found = await tree.run(fleet.ledger.find_run, run)
        instance = await tree.run(fleet.ledger.get_instance, found.instance) if found.instance else None
        cost = await tree.run(run_cost, fleet.ledger, found)
        await tree.say(interaction, status_embed(found, instance, cost_usd=cost), ephemeral=not public)

    @tree.command(name="runs", description="The newest runs.")
    @app_commands.describe(public=PUBLIC_HELP)
    async def runs(interaction: discord.Interaction[Any], public: bool = False) -> None:
        found = await tree.run(fleet.ledger.list_runs, 15)
        text = "\n".join(_run_line(r) for r in found) or "no runs yet; start one with /train"
        await tree.say(interaction, plain_embed("Runs", text), ephemeral=not public)

    @tree.command(name="logs", description="A run's latest events, and what its node printed as a file.")
    @app_commands.describe(run="A run id (or a unique prefix).", public=PUBLIC_HELP)
    @app_commands.autocomplete(run=runs_choices)
    async def logs(interaction: discord.Interaction[Any], run: str, public: bool = False) -> None:
        found = await tree.run(fleet.ledger.find_run, run)
        lines = [
            describe(e)
            for _sid, e in await tree.run(lambda: list(events.read_run(fleet.redis, found.run_id)))
        ]
        shown = lines[-LOG_LINES:]
        body = "\n".join(shown)
        while len(body) > DESCRIPTION_MAX - 10 and len(shown) > 1:
            shown = shown[1:]
            body = "\n".join(shown)
        kept = await tree.run(nodelogs.read, fleet.redis, found.run_id)
        node_text = "".join(nodelogs.heading(sid) + text for sid, text in kept)[-NODE_LOG_TAIL:]
        await tree.say(
            interaction,
            plain_embed(f"{found.run_id}: last {len(shown)} of {len(lines)} events", f"```\n{body}\n```"),
            ephemeral=not public,
            attach=(f"node-{found.run_id}.log", node_text) if node_text else None,
        )

    _register_cancel(tree, runs_choices)


def _register_cancel(tree: FleetTree, runs_choices: Callable[..., Any]) -> None:
    fleet = tree.fleet

    @tree.command(
        name="cancel",
        description="Cancel your run (admins: any run): its job is stopped, its node terminated.",
    )
    @app_commands.describe(run="A run id (or a unique prefix).")
    @app_commands.autocomplete(run=runs_choices)
    async def cancel(interaction: discord.Interaction[Any], run: str) -> None:
        found = await tree.run(fleet.ledger.find_run, run)
        if found.state.is_terminal():
            await tree.refuse(
                interaction, "Nothing to cancel", f"run {found.run_id} already ended {found.state.value}"
            )
            return
        if not await tree.may_stop(interaction, found.run_id, f"run {found.run_id}"):
            return
        done = await tree.run(svc.cancel, fleet, found.run_id)
        await tree.audit(
            EventType.BOT_COMMAND,
            Caller.of(interaction),
            command="cancel",
            run_id=done.run_id,
        )
        await tree.say(
            interaction,
            plain_embed(f"Cancelling {done.run_id}", f"was {found.state.value}; its node will be terminated"),
        )


def _run_line(run: Run) -> str:
    age = (time.time() - run.created_at) / 60
    loss = run.metrics.get("eval_loss")
    shown = f" · eval_loss {loss:.4g}" if isinstance(loss, float) else ""
    return f"`{run.run_id}` **{run.state.value}** · {run.provider} · {age:.0f}m{shown} · {run.source}"
