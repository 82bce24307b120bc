"""/train and /sweep: a job (or a sweep of jobs) from an attached YAML or a named config, submitted within
the caller's caps (a sweep counts as one run per child)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import discord
from discord import app_commands

from bot.access import Caller
from bot.render import sweep_embed
from bot.replies import CHOICES_MAX, plain_embed
from core.errors import ConfigError, Problem
from core.settings import Settings
from jobs.paths import Confinement
from jobs.spec import LoadedJob, format_problems, load_job, parse_job
from jobs.yamlsafe import MAX_BYTES, read_job_file
from service import runs as svc
from service import sweep_spec, sweeps
from service.sweep_load import parse_sweep
from state.payloads import EventType

if TYPE_CHECKING:
    from bot.commands import FleetTree

T = TypeVar("T")


def register_submit(tree: FleetTree) -> None:
    """Add /train and /sweep to `tree`, each with its configs' autocomplete."""
    settings = tree.fleet.settings
    train = _register_train(tree)
    sweep = _register_sweep(tree)

    async def config_choices(
        interaction: discord.Interaction[Any], current: str
    ) -> list[app_commands.Choice[str]]:
        names = await tree.run(_config_names, settings.bot_configs_dir, current)
        return [app_commands.Choice(name=n, value=n) for n in names]

    train.autocomplete("config")(config_choices)
    sweep.autocomplete("config")(config_choices)


def _register_train(tree: FleetTree) -> app_commands.Command[Any, ..., None]:
    fleet, settings = tree.fleet, tree.fleet.settings

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
        origin = caller.origin()
        try:
            job = await _load_job(settings, file, config)
            await tree.run(svc.check_submittable, fleet.world, job, origin)
        except ConfigError as exc:
            await tree.refuse(interaction, "Invalid job", f"```\n{format_problems(exc)}\n```")
            return
        submit = functools.partial(svc.submit, fleet, job, origin=origin)
        budget = functools.partial(svc.check_budget, fleet, [job], origin)
        run = await submit_within_caps(
            tree, interaction, caller, "train", 1, submit, lambda r: [r.run_id], budget=budget
        )
        if run is None:
            return
        await tree.audit(EventType.BOT_COMMAND, caller, command="train", run_id=run.run_id)
        text = (
            f"provider **{run.provider}** · from `{run.source}`\nIts status message follows in the channel."
        )
        await tree.say(interaction, plain_embed(f"Run {run.run_id} queued", text))

    return train


def _register_sweep(tree: FleetTree) -> app_commands.Command[Any, ..., None]:
    fleet, settings = tree.fleet, tree.fleet.settings

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
        max_parallel: app_commands.Range[int, 1, sweep_spec.MAX_PARALLEL] | None = None,
    ) -> None:
        caller = Caller.of(interaction)
        origin = caller.origin()
        try:
            plan = await _load_sweep(tree, settings, file, config, sweep_file, max_parallel)
            for job in plan.jobs:
                await tree.run(svc.check_submittable, fleet.world, job, origin)
        except ConfigError as exc:
            await tree.refuse(interaction, "Invalid sweep", f"```\n{format_problems(exc)}\n```")
            return
        count = len(plan.jobs)
        found = await submit_within_caps(
            tree,
            interaction,
            caller,
            "sweep",
            count,
            functools.partial(sweeps.submit_sweep, fleet, plan, origin),
            lambda s: s.runs,
            refused=f"a sweep of {count} runs counts as {count} runs: ",
            budget=functools.partial(svc.check_budget, fleet, plan.jobs, origin),  # the children together
        )
        if found is None:
            return
        await tree.audit(EventType.BOT_COMMAND, caller, command="sweep", sweep_id=found.sweep_id)
        view = await tree.run(sweeps.sweep_view, fleet, found)
        await tree.say(interaction, sweep_embed(view))

    return sweep


async def submit_within_caps(
    tree: FleetTree,
    interaction: discord.Interaction[Any],
    caller: Caller,
    command: str,
    count: int,
    submit: Callable[[], T],
    run_ids: Callable[[T], list[str]],
    refused: str = "",
    budget: Callable[[], None] | None = None,
) -> T | None:
    """Reserve `count` runs against the caller's caps, check their worst case against the money caps
    (`budget`: service.runs.check_budget, whose OverBudget is answered privately), then defer and `submit`:
    the reservations become the submitted runs (`run_ids` of what it returned), or are given back when
    anything fails. Over a per-user cap: nothing is submitted, the refusal (`refused` + why) is audited
    and answered privately, and None returned."""
    tokens, why = await tree.run(tree.caps.reserve_runs, caller.user_id, count)
    if tokens is None:
        reason = f"{refused}{why}"
        await tree.audit(EventType.BOT_REFUSED, caller, command=command, kind="cap", reason=reason)
        await tree.refuse(interaction, "Over your cap", reason)
        return None
    try:
        if budget is not None:
            await tree.run(budget)
    except BaseException:
        await tree.run(tree.caps.release_runs, caller.user_id, tokens)
        raise
    await interaction.response.defer(thinking=True)
    try:
        done = await tree.run(submit)
    except BaseException:
        await tree.run(tree.caps.release_runs, caller.user_id, tokens)
        raise
    await tree.run(tree.caps.confirm_runs, caller.user_id, tokens, run_ids(done))
    return done


async def _load_job(settings: Settings, file: discord.Attachment | None, config: str | None) -> LoadedJob:
    if (file is None) == (config is None):
        raise ConfigError("/train", [Problem("", "give either a YAML file or the name of a config")])
    if config is not None:
        return load_job(
            _config_path(settings.bot_configs_dir, config),
            default_provider=settings.default_provider,
            data_roots=settings.data_roots,
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
        paths=_attached(settings),
    )


async def _load_sweep(
    tree: FleetTree,
    settings: Settings,
    file: discord.Attachment | None,
    config: str | None,
    sweep_file: discord.Attachment | None,
    max_parallel: int | None,
) -> sweep_spec.SweepPlan:
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
        data, source, base_dir = read_job_file(path), config, path.parent
        paths = Confinement(base_dir, settings.data_roots)
    else:
        assert file is not None
        data, source, base_dir = await file.read(), file.filename, settings.bot_configs_dir.resolve()
        paths = _attached(settings)
    return await tree.run(
        lambda: parse_sweep(
            data,
            source=source,
            base_dir=base_dir,
            sweep_data=sweep_data,
            sweep_source=sweep_source,
            default_provider=settings.default_provider,
            max_parallel=max_parallel,
            paths=paths,
        )
    )


def _attached(settings: Settings) -> Confinement:
    """An attachment has no directory of its own: its relative paths are looked up in the configs
    directory as before, but its local files may be only under the operator's data roots."""
    return Confinement(None, settings.data_roots)


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
