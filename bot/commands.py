"""The bot's slash commands: the same service functions as the CLI, behind the access check.

`FleetTree.interaction_check` runs for every command and every autocomplete before anything else (before
any defer): a refused caller gets an ephemeral reason (or no choices), and an audit event is written.
Replies are embeds; errors are ephemeral and say what to fix, with `fleet validate`'s messages for a YAML.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import discord
from discord import app_commands

from bot.access import Caller, Caps, audit, refusal
from bot.render import (
    COLOURS,
    DESCRIPTION_MAX,
    RUNNING_COLOUR,
    Scrubber,
    fit_embed,
    status_embed,
    sweep_embed,
)
from broker import events
from broker.cost import run_cost
from broker.models import EventType, Run, RunState
from core.errors import ConfigError, FleetError, Problem
from jobs.spec import LoadedJob, format_problems, load_job, parse_job
from jobs.yamlsafe import MAX_BYTES
from service import runs as svc
from service import sweeps
from service.describe import describe
from service.runs import Fleet

log = logging.getLogger(__name__)
T = TypeVar("T")
ERROR_COLOUR = 0xE74C3C
CHOICES_MAX = 25  # Discord shows at most 25 autocomplete choices
LOG_LINES = 25


def _embed(title: str, description: str = "", colour: int = RUNNING_COLOUR) -> dict[str, Any]:
    return {"title": title, "description": description, "color": colour}


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
        self, interaction: discord.Interaction[Any], embed: dict[str, Any], ephemeral: bool = False
    ) -> None:
        """Answer with an embed (scrubbed, cut to Discord's limits), or follow up when the interaction was
        already answered (deferred)."""
        fitted = discord.Embed.from_dict(fit_embed(self.scrub.deep(embed)))
        if interaction.response.is_done():
            await interaction.followup.send(embed=fitted, ephemeral=ephemeral)
        else:
            await interaction.response.send_message(embed=fitted, ephemeral=ephemeral)

    async def refuse(self, interaction: discord.Interaction[Any], title: str, text: str) -> None:
        """An error: private to the caller, saying what to fix."""
        await self.say(interaction, _embed(title, text, ERROR_COLOUR), ephemeral=True)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """A blocking service call, off the event loop."""
        return await asyncio.to_thread(fn, *args)

    async def audit(self, event_type: EventType, caller: Caller, **data: Any) -> None:
        await self.run(audit, self.fleet.ledger, event_type, caller, data)


def _run_line(run: Run) -> str:
    age = (time.time() - run.created_at) / 60
    loss = run.metrics.get("eval_loss")
    shown = f" · eval_loss {loss:.4g}" if isinstance(loss, float) else ""
    return f"`{run.run_id}` **{run.state.value}** · {run.provider} · {age:.0f}m{shown} · {run.source}"


def _config_names(directory: Path, current: str) -> list[str]:
    """The YAML files under the configs directory (relative names) that contain `current`."""
    if not directory.is_dir():
        return []
    names = sorted(
        str(p.relative_to(directory)) for p in directory.rglob("*") if p.suffix in (".yml", ".yaml")
    )
    return [n for n in names if current.lower() in n.lower()][:CHOICES_MAX]


def _config_path(directory: Path, name: str) -> Path:
    """A config by name, refused when it is not a file inside the configs directory."""
    root = directory.resolve()
    path = (root / name).resolve()
    if root not in path.parents or not path.is_file():
        raise ConfigError(name, [Problem("config", f"no config named {name!r} in the configs directory")])
    return path


def register(tree: FleetTree) -> None:
    """Add the fleet's commands to `tree`."""
    fleet, settings = tree.fleet, tree.fleet.settings

    async def load(file: discord.Attachment | None, config: str | None) -> LoadedJob:
        if (file is None) == (config is None):
            raise ConfigError("/train", [Problem("", "give either a YAML file or the name of a config")])
        if config is not None:
            return load_job(
                _config_path(settings.bot_configs_dir, config), default_provider=settings.default_provider
            )
        assert file is not None
        if file.size > MAX_BYTES:
            raise ConfigError(
                file.filename, [Problem("", f"file is {file.size} bytes; the limit is {MAX_BYTES}")]
            )
        data = await file.read()
        return parse_job(
            data,
            source=file.filename,
            base_dir=settings.bot_configs_dir.resolve(),
            default_provider=settings.default_provider,
        )

    async def runs_choices(
        interaction: discord.Interaction[Any], current: str
    ) -> list[app_commands.Choice[str]]:
        runs = await tree.run(fleet.ledger.list_runs, 100)
        found = [r for r in runs if r.run_id.startswith(current)][:CHOICES_MAX]
        return [app_commands.Choice(name=f"{r.run_id} {r.state.value}", value=r.run_id) for r in found]

    @tree.command(name="train", description="Start a training run from a YAML file or a named config.")
    @app_commands.describe(
        file="A job YAML (axolotl-style, with one provider section).", config="A config by name."
    )
    async def train(
        interaction: discord.Interaction[Any],
        file: discord.Attachment | None = None,
        config: str | None = None,
    ) -> None:
        caller = Caller.of(interaction)
        try:
            job = await load(file, config)
            await tree.run(svc.check_submittable, settings, job)
        except ConfigError as exc:
            await tree.refuse(interaction, "Invalid job", f"```\n{format_problems(exc)}\n```")
            return
        await tree.run(svc.check_budget, fleet)  # over the fleet's cap: OverBudget, answered privately
        token, why = await tree.run(tree.caps.reserve, caller.user_id)
        if token is None:
            await tree.audit(EventType.BOT_REFUSED, caller, command="train", kind="cap", reason=why)
            await tree.refuse(interaction, "Over your cap", str(why))
            return
        await interaction.response.defer(thinking=True)
        try:
            run = await tree.run(svc.submit, fleet, job)
        except BaseException:
            await tree.run(tree.caps.release, caller.user_id, token)
            raise
        await tree.run(tree.caps.confirm, caller.user_id, token, run.run_id)
        await tree.audit(EventType.BOT_COMMAND, caller, command="train", run_id=run.run_id)
        text = (
            f"provider **{run.provider}** · from `{run.source}`\nIts status message follows in the channel."
        )
        await tree.say(interaction, _embed(f"Run {run.run_id} queued", text))

    @tree.command(name="sweep", description="Start a sweep: one run per combination of values.")
    @app_commands.describe(
        file="A job YAML with a sweep: section (or with sweep_file).",
        config="A config by name.",
        sweep_file="A sweep in axolotl's --sweep format (key: [values], _: paired settings).",
        max_parallel="Children active at once (overrides the file).",
    )
    async def sweep(
        interaction: discord.Interaction[Any],
        file: discord.Attachment | None = None,
        config: str | None = None,
        sweep_file: discord.Attachment | None = None,
        max_parallel: app_commands.Range[int, 1, sweeps.MAX_PARALLEL] | None = None,
    ) -> None:
        caller = Caller.of(interaction)
        try:
            plan = await load_sweep(file, config, sweep_file, max_parallel)
            for job in plan.jobs:
                await tree.run(svc.check_submittable, settings, job)
        except ConfigError as exc:
            await tree.refuse(interaction, "Invalid sweep", f"```\n{format_problems(exc)}\n```")
            return
        await tree.run(svc.check_budget, fleet)
        tokens: list[str] = []
        for _ in plan.jobs:  # a sweep counts as one run per child against the caller's caps
            token, why = await tree.run(tree.caps.reserve, caller.user_id)
            if token is None:
                for held in tokens:
                    await tree.run(tree.caps.release, caller.user_id, held)
                reason = f"a sweep of {len(plan.jobs)} runs counts as {len(plan.jobs)} runs: {why}"
                await tree.audit(EventType.BOT_REFUSED, caller, command="sweep", kind="cap", reason=reason)
                await tree.refuse(interaction, "Over your cap", reason)
                return
            tokens.append(token)
        await interaction.response.defer(thinking=True)
        try:
            found = await tree.run(sweeps.submit_sweep, fleet, plan)
        except BaseException:
            for held in tokens:
                await tree.run(tree.caps.release, caller.user_id, held)
            raise
        for token, run_id in zip(tokens, found.runs, strict=True):
            await tree.run(tree.caps.confirm, caller.user_id, token, run_id)
        await tree.audit(EventType.BOT_COMMAND, caller, command="sweep", sweep_id=found.sweep_id)
        view = await tree.run(sweeps.sweep_view, fleet, found)
        await tree.say(interaction, sweep_embed(view))

    async def load_sweep(
        file: discord.Attachment | None,
        config: str | None,
        sweep_file: discord.Attachment | None,
        max_parallel: int | None,
    ) -> sweeps.SweepPlan:
        if (file is None) == (config is None):
            raise ConfigError("/sweep", [Problem("", "give either a YAML file or the name of a config")])
        for attached in (file, sweep_file):
            if attached is not None and attached.size > MAX_BYTES:
                message = f"file is {attached.size} bytes; the limit is {MAX_BYTES}"
                raise ConfigError(attached.filename, [Problem("", message)])
        sweep_data = await sweep_file.read() if sweep_file is not None else None
        sweep_source = sweep_file.filename if sweep_file is not None else None
        if config is not None:
            path = _config_path(settings.bot_configs_dir, config)
            data, source, base_dir = path.read_bytes(), config, path.parent
        else:
            assert file is not None
            data, source, base_dir = await file.read(), file.filename, settings.bot_configs_dir.resolve()
        return await tree.run(
            lambda: sweeps.parse_sweep(
                data,
                source=source,
                base_dir=base_dir,
                sweep_data=sweep_data,
                sweep_source=sweep_source,
                default_provider=settings.default_provider,
                max_parallel=max_parallel,
            )
        )

    @sweep.autocomplete("config")
    @train.autocomplete("config")
    async def config_choices(
        interaction: discord.Interaction[Any], current: str
    ) -> list[app_commands.Choice[str]]:
        names = await tree.run(_config_names, settings.bot_configs_dir, current)
        return [app_commands.Choice(name=n, value=n) for n in names]

    @tree.command(name="status", description="One run's status (the newest run when none is named).")
    @app_commands.describe(run="A run id (or a unique prefix).")
    @app_commands.autocomplete(run=runs_choices)
    async def status(interaction: discord.Interaction[Any], run: str | None = None) -> None:
        if run is None:
            newest = await tree.run(fleet.ledger.list_runs, 1)
            if not newest:
                await tree.say(interaction, _embed("No runs yet", "start one with /train"))
                return
            found = newest[0]
        else:
            found = await tree.run(fleet.ledger.find_run, run)
        instance = await tree.run(fleet.ledger.get_instance, found.instance) if found.instance else None
        cost = await tree.run(run_cost, fleet.ledger, found)
        await tree.say(interaction, status_embed(found, instance, cost_usd=cost))

    @tree.command(name="runs", description="The newest runs.")
    async def runs(interaction: discord.Interaction[Any]) -> None:
        found = await tree.run(fleet.ledger.list_runs, 15)
        text = "\n".join(_run_line(r) for r in found) or "no runs yet; start one with /train"
        await tree.say(interaction, _embed("Runs", text))

    @tree.command(name="logs", description="A run's latest events.")
    @app_commands.describe(run="A run id (or a unique prefix).")
    @app_commands.autocomplete(run=runs_choices)
    async def logs(interaction: discord.Interaction[Any], run: str) -> None:
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
        await tree.say(
            interaction,
            _embed(f"{found.run_id}: last {len(shown)} of {len(lines)} events", f"```\n{body}\n```"),
        )

    @tree.command(name="cancel", description="Cancel a run: its job is stopped and its node terminated.")
    @app_commands.describe(run="A run id (or a unique prefix).")
    @app_commands.autocomplete(run=runs_choices)
    async def cancel(interaction: discord.Interaction[Any], run: str) -> None:
        found = await tree.run(fleet.ledger.find_run, run)
        if found.state.is_terminal():
            await tree.refuse(
                interaction, "Nothing to cancel", f"run {found.run_id} already ended {found.state.value}"
            )
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
            _embed(f"Cancelling {done.run_id}", f"was {found.state.value}; its node will be terminated"),
        )

    async def instance_choices(
        interaction: discord.Interaction[Any], current: str
    ) -> list[app_commands.Choice[str]]:
        records = await tree.run(fleet.ledger.list_instances)
        found = [i.name for i in records if not i.state.is_terminal() and current in i.name][:CHOICES_MAX]
        return [app_commands.Choice(name=n, value=n) for n in found]

    @tree.command(name="instances", description="The fleet's live instances at every provider.")
    async def instances(interaction: discord.Interaction[Any]) -> None:
        from service.instances import live_instances

        await interaction.response.defer(thinking=True)
        rows = await tree.run(live_instances, fleet)
        lines = [
            f"`{r.node.name}` {r.node.provider.value} {r.node.state.value} · {r.node.age_s / 60:.0f}m · "
            f"${r.node.price_per_hour:.3f}/h · run {r.run_id or '-'} {r.run_state or ''}"
            for r in rows
        ]
        per_hour = sum(r.node.price_per_hour for r in rows)
        await tree.say(
            interaction, _embed(f"{len(rows)} live instances · ${per_hour:.3f}/h", "\n".join(lines) or "none")
        )

    @tree.command(name="terminate", description="Terminate one instance now (not while its run is going).")
    @app_commands.describe(
        instance="An instance name, tf-<run>-<attempt>.", force="Even while its run is going."
    )
    @app_commands.autocomplete(instance=instance_choices)
    async def terminate(interaction: discord.Interaction[Any], instance: str, force: bool = False) -> None:
        from service.instances import terminate as terminate_instance

        await interaction.response.defer(thinking=True)
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
            _embed(
                f"Terminated {row.node.name}", f"at {row.node.provider.value}", COLOURS[RunState.CANCELLED]
            ),
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
        await tree.say(interaction, _embed("Budget", text), ephemeral=True)
