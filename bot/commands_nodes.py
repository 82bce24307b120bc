"""/instances, /terminate, /budget and /jupyter: the fleet's live instances, ending one, what is being spent
(the caller's caps and use, and the fleet's hourly rate), and the way into a run's JupyterLab (its owner's
only, privately).

/terminate is for the run's owner and the admins (an instance of no run we know: admins only). It and
/instances defer privately: Discord makes the first followup after a deferral as private or public as the
deferral was, whatever the followup's own flags say, so an error after a public deferral would be public."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import discord
from discord import app_commands

from bot.access import Caller
from bot.render import COLOURS
from bot.replies import CHOICES_MAX, plain_embed
from state.payloads import EventType
from state.stages import RunState

if TYPE_CHECKING:
    from bot.commands import FleetTree


def register_nodes(tree: FleetTree) -> None:
    """Add the instance, budget and JupyterLab commands to `tree`."""
    fleet = tree.fleet
    _register_jupyter(tree)

    async def instance_choices(
        interaction: discord.Interaction[Any], current: str
    ) -> list[app_commands.Choice[str]]:
        records = await tree.run(fleet.ledger.list_instances)
        found = [i.name for i in records if not i.state.is_terminal() and current in i.name][:CHOICES_MAX]
        return [app_commands.Choice(name=n, value=n) for n in found]

    @tree.command(name="instances", description="The fleet's live instances at every provider.")
    @app_commands.describe(public="Show the answer to the channel (default: only you see it).")
    async def instances(interaction: discord.Interaction[Any], public: bool = False) -> None:
        from service.instances import live_instances

        await interaction.response.defer(ephemeral=not public, thinking=True)
        rows = await tree.run(live_instances, fleet)
        lines = [
            f"`{r.node.name}` {r.node.provider.value} {r.node.state.value} · {r.node.age_s / 60:.0f}m · "
            f"${r.node.price_per_hour:.3f}/h · run {r.run_id or '-'} {r.run_state or ''}"
            for r in rows
        ]
        per_hour = sum(r.node.price_per_hour for r in rows)
        await tree.say(
            interaction,
            plain_embed(f"{len(rows)} live instances · ${per_hour:.3f}/h", "\n".join(lines) or "none"),
            ephemeral=not public,
        )

    @tree.command(
        name="terminate",
        description="Terminate your run's instance now (admins: any; not while its run goes).",
    )
    @app_commands.describe(
        instance="An instance name, tf-<run>-<attempt>.", force="Even while its run is going."
    )
    @app_commands.autocomplete(instance=instance_choices)
    async def terminate(interaction: discord.Interaction[Any], instance: str, force: bool = False) -> None:
        from service.instances import terminate as terminate_instance

        record = await tree.run(fleet.ledger.get_instance, instance)
        run_id = record.run_id if record is not None else None
        if not await tree.may_stop(interaction, run_id, f"instance {instance}"):
            return
        await interaction.response.defer(ephemeral=True, thinking=True)  # its errors stay private too
        row = await tree.run(terminate_instance, fleet, instance, force)
        await tree.audit(
            EventType.BOT_COMMAND,
            Caller.of(interaction),
            command="terminate",
            instance=instance,
            force=force,
        )
        await tree.say(
            interaction,
            plain_embed(
                f"Terminated {row.node.name}", f"at {row.node.provider.value}", COLOURS[RunState.CANCELLED]
            ),
            ephemeral=True,
        )

    @tree.command(name="budget", description="Your caps and use, and what the fleet is spending.")
    async def budget(interaction: discord.Interaction[Any]) -> None:
        usage = await tree.run(tree.caps.usage, interaction.user.id)
        records = await tree.run(fleet.ledger.list_instances)
        live = [i for i in records if not i.state.is_terminal()]
        per_hour = sum(i.price_per_hour or 0.0 for i in live)
        text = (
            f"your runs in the last hour: **{usage.runs_last_hour}** of {usage.runs_per_hour}\n"
            f"your runs' cost in 24 h: **${usage.spent_today:.2f}** of ${usage.dollars_per_day:.2f}\n"
            f"the fleet now: **{len(live)}** instances at **${per_hour:.3f}/h**"
        )
        await tree.say(interaction, plain_embed("Budget", text), ephemeral=True)


def _register_jupyter(tree: FleetTree) -> None:
    fleet = tree.fleet

    @tree.command(name="jupyter", description="The JupyterLab URL of your run's node (only you see it).")
    @app_commands.describe(run="A run id (or a unique prefix) that you started, with `jupyter: true`.")
    async def jupyter(interaction: discord.Interaction[Any], run: str) -> None:
        from service.nodeaccess import jupyter_url

        found = await tree.run(fleet.ledger.find_run, run)
        if await tree.run(tree.caps.owner, found.run_id) != interaction.user.id:
            why = f"only the user who started run {found.run_id} from Discord may see its JupyterLab"
            await tree.refuse(interaction, "Not your run", why)
            return
        await interaction.response.defer(ephemeral=True, thinking=True)  # the answer stays private
        url = await tree.run(jupyter_url, fleet, found.run_id)
        caller = Caller.of(interaction)
        await tree.audit(EventType.BOT_COMMAND, caller, command="jupyter", run_id=found.run_id)  # no URL
        text = f"[JupyterLab]({url})\n`{url}`\nThe token in it lets anyone in: keep it to yourself."
        await tree.say(interaction, plain_embed(f"Run {found.run_id}: JupyterLab", text), ephemeral=True)
