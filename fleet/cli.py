"""`fleet`: the command line. Every command is a thin layer over service.runs and the ledger.

This module holds the app, `main` (the console script) and the commands on runs: validate, enqueue, run
(following it live), status, logs and cancel. The other commands register themselves on the same app from
their modules: cli_procs (worker, beat, up, notify, bot, down), cli_nodes (instances, terminate, offers,
node), cli_sweep (sweep), cli_watch (watch) and cli_ops (flower).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import redis
import typer

from core import redisurl
from core.errors import ConfigError, FleetError
from fleet import cli_nodes, cli_offers, cli_ops, cli_procs, cli_status, cli_sweep, cli_watch, live
from fleet.cli_common import (
    JsonOpt,
    connect_or_exit,
    err,
    find_run_or_exit,
    out,
    world_or_exit,
)
from jobs.spec import LoadedJob, format_problems, load_job
from providers.world import World
from service import runs as svc
from service.axolotl_check import AxolotlVerdict
from service.axolotl_check import check as axolotl_verdict
from service.describe import describe, run_view
from service.gitwatch import DEFAULT_GLOB
from service.plan import JobPlan, plan_job
from service.sweeps import SWEEP_PREFIX
from state import events, nodelogs
from state.models import Run
from state.payloads import TERMINAL_EVENTS

cli = typer.Typer(help="trainfleet: submit an axolotl-style YAML and walk away.", no_args_is_help=True)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        out.print(f"trainfleet {version('trainfleet')}", highlight=False)
        raise typer.Exit()


@cli.callback()
def _options(
    _version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """The options before any command: --version, and typer's --install-completion (tab completion of
    commands and options in bash, zsh, fish or PowerShell)."""


UseRay = Annotated[bool, typer.Option("--use-ray", help="Set use_ray: true (like axolotl's flag).")]


def _load(paths: list[Path], world: World, use_ray: bool) -> list[LoadedJob]:
    """Validate every file; print every problem and exit 1 if any is invalid (nothing is enqueued)."""
    settings = world.settings
    jobs, failed = [], False
    overrides = {"use_ray": True} if use_ray else None
    for path in paths:
        try:
            job = load_job(
                path,
                default_provider=settings.default_provider,
                overrides=overrides,
                data_roots=settings.data_roots,
            )
            svc.check_submittable(world, job)
            jobs.append(job)
        except ConfigError as exc:
            failed = True
            err.print(format_problems(exc), markup=False, highlight=False)
    if failed:
        raise typer.Exit(1)
    for job in jobs:
        for warning in job.warnings:
            err.print(f"[yellow]warning[/yellow] {job.source}: {warning}", highlight=False)
    return jobs


@cli.command()
def validate(
    files: Annotated[list[Path], typer.Argument(help="Job YAML files.")],
    plan: Annotated[
        bool, typer.Option("--plan", help="Also show the plan: trainer, command, GPUs, $/h, worst case.")
    ] = False,
    provider: Annotated[
        str | None, typer.Option(help="The provider of a file with no provider section (default: settings).")
    ] = None,
    axolotl_check: Annotated[
        bool,
        typer.Option(
            help="Check axolotl jobs with axolotl's own config model too, where axolotl is installed."
        ),
    ] = True,
    as_json: JsonOpt = False,
) -> None:
    """Check job files; print every problem with its key and line, and the trainer each would run with.
    Exit 1 on any problem."""
    world = world_or_exit()
    settings = world.settings
    failed, shown = False, []
    for path in files:
        try:
            job = load_job(
                path, default_provider=provider or settings.default_provider, data_roots=settings.data_roots
            )
            verdict = axolotl_verdict(settings, job) if axolotl_check else None
            if verdict is not None and verdict.problems:
                raise ConfigError(job.source, verdict.problems)
        except ConfigError as exc:
            failed = True
            err.print(format_problems(exc), markup=False, highlight=False)
            continue
        for warning in job.warnings:
            err.print(f"[yellow]warning[/yellow] {job.source}: {warning}", highlight=False)
        if as_json or plan:
            shown.append(plan_job(world, job))
        if not as_json:
            out.print(f"[green]ok[/green] {job.source} (provider {job.spec.provider.value})", highlight=False)
            out.print(f"  {job.choice.describe() if job.choice else job.spec.train.trainer}", highlight=False)
            if job.spec.train.trainer == "axolotl":
                out.print(f"  {_checked_by(verdict, axolotl_check)}", markup=False, highlight=False)
        if plan and not as_json:
            _print_plan(shown[-1])
    if as_json:
        out.print_json(json.dumps([p.model_dump(mode="json") for p in shown]))
    if failed:
        raise typer.Exit(1)


def _checked_by(verdict: AxolotlVerdict | None, asked: bool) -> str:
    if verdict is not None:
        return f"checked with axolotl {verdict.version}'s own config model ({verdict.python})"
    if not asked:
        return "axolotl's own check: skipped (--no-axolotl-check)"
    return (
        "axolotl's own check: skipped, no axolotl here (`make axolotl-env`, or pip install "
        "'trainfleet[axolotl]'); its other keys are checked on the node"
    )


def _dollars(worst: float | None) -> str:
    return "no bound" if worst is None else f"${worst:,.2f}"


def _print_plan(plan: JobPlan) -> None:
    price = f"${plan.price_per_hour:.2f}/h" if plan.price_per_hour is not None else "unknown"
    rows = [
        ("command", plan.command),
        ("software", plan.software + (f" (axolotl {plan.axolotl_version})" if plan.axolotl_version else "")),
        ("machines", plan.machines),
        ("workers", plan.workers),
        ("price", f"{price}: {plan.price_note}"),
        ("worst", f"{_dollars(plan.worst_case_usd)}: {plan.worst_case_note}"),
    ]
    for name, value in rows:
        out.print(f"  {name + ':':<10}{value}", markup=False, highlight=False)


@cli.command()
def enqueue(
    files: Annotated[list[Path] | None, typer.Argument(help="Job YAML files.")] = None,
    use_ray: UseRay = False,
    as_json: JsonOpt = False,
    changed_since: Annotated[
        str | None,
        typer.Option(metavar="REF", help="Instead of FILES: the configs changed in REF..HEAD of --repo."),
    ] = None,
    repo: Annotated[Path, typer.Option(help="The git repository for --changed-since.")] = Path("."),
    glob: cli_watch.GlobOpt = [DEFAULT_GLOB],  # noqa: B006 - typer copies it
) -> None:
    """Validate all files, then queue one run per file and print the run ids.

    With --changed-since REF: the configs matching --glob that REF..HEAD added or modified, read as of
    HEAD, each queued once per (HEAD, path) however often this runs (see docs/git-trigger.md)."""
    if changed_since is not None and not files:
        cli_watch.enqueue_changed(repo, changed_since, glob, use_ray, as_json)
    if not files or changed_since is not None:
        err.print("give job FILES, or --changed-since REF (not both)", style="red")
        raise typer.Exit(2)
    world = world_or_exit()
    jobs = _load(files, world, use_ray)
    fleet = connect_or_exit(world)
    svc.check_budget(fleet, jobs)  # before the first, all together: all the files are queued, or none
    runs = [_submit(fleet, job) for job in jobs]
    if as_json:
        out.print_json(json.dumps([{"run_id": r.run_id, "source": r.source} for r in runs]))
    else:
        for run in runs:
            print(run.run_id)
    from workers.process import missing_queues

    if missing := missing_queues(fleet.redis):
        err.print(
            f"[yellow]no worker serves {', '.join(missing)} yet: start `fleet up` or `fleet worker`[/yellow]"
        )


def _submit(fleet: svc.Fleet, job: LoadedJob) -> Run:
    try:
        return svc.submit(fleet, job)
    except ConfigError as exc:
        err.print(format_problems(exc), markup=False, highlight=False)
        raise typer.Exit(1) from None


@cli.command()
def run(
    file: Annotated[Path, typer.Argument(help="A job YAML file.")],
    use_ray: UseRay = False,
    as_json: JsonOpt = False,
) -> None:
    """Submit a job and follow it live until it ends; exit 0 only when it SUCCEEDED.

    Starts a worker (with the reaper's beat) itself when none is up, and stops it on the way out. Ctrl-C
    (or SIGTERM, SIGHUP) cancels the run cleanly (its node is terminated); a second one leaves at once.
    """
    world = world_or_exit()
    settings = world.settings
    (job,) = _load([file], world, use_ray)
    fleet = connect_or_exit(world)

    def unfinished(run: Run) -> tuple[str, str] | None:
        state = fleet.ledger.get_run(run.run_id).state
        return None if state.is_terminal() else (run.run_id, state.value)

    final = live.waited(
        fleet,
        settings,
        "run",
        submit=lambda: _submit(fleet, job),
        cancel=lambda run: svc.cancel(fleet, run.run_id),
        wait=lambda run: live.follow(fleet, run, live=not as_json and out.is_terminal, quiet=as_json),
        unfinished=unfinished,
    )
    if as_json:
        out.print_json(run_view(fleet, final).model_dump_json())
    else:
        _summary(final)
    raise typer.Exit(0 if final.state.value == "SUCCEEDED" else 1)


def _summary(run: Run) -> None:
    color = {"SUCCEEDED": "green", "FAILED": "red", "CANCELLED": "yellow"}.get(run.state.value, "white")
    out.print(f"[{color}]{run.run_id} {run.state.value}[/{color}]", highlight=False)
    if run.failure_reason:
        out.print(f"reason: {run.failure_reason.value}: {run.failure_message}", markup=False, highlight=False)
    if run.state.value == "SUCCEEDED":
        m = run.metrics
        out.print(f"output: {run.output_dir}", highlight=False)
        first, last = _loss(m.get("eval_loss_first")), _loss(m.get("eval_loss"))
        out.print(f"eval_loss: {first} -> {last}", highlight=False)


def _loss(value: object) -> str:
    """A loss as people read it (4 significant digits); `fleet status --json` keeps it whole."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


@cli.command()
def status(
    run_id: Annotated[str | None, typer.Argument(help="A run or sweep id (or a unique prefix).")] = None,
    as_json: JsonOpt = False,
    limit: Annotated[int, typer.Option(help="How many runs to list.")] = 20,
) -> None:
    """Show one run or sweep (its table of parameters against the metric), or list runs newest first."""
    fleet = connect_or_exit(world_or_exit(), reading=True)
    if run_id is not None and run_id.startswith(SWEEP_PREFIX):
        cli_sweep.status(fleet, run_id, as_json)
        return
    if run_id is not None:
        cli_status.show_run(fleet, find_run_or_exit(fleet, run_id), as_json)
        return
    cli_status.show_runs(fleet, fleet.ledger.list_runs(limit), as_json)


@cli.command()
def logs(
    run_id: Annotated[str, typer.Argument(help="A run id (or a unique prefix).")],
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing until the run ends.")] = False,
    node: Annotated[
        bool,
        typer.Option("--node", help="What its jobs printed on the node (the trainer's output)."),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Print a run's events in order, or with --node what its Ray jobs printed on the node."""
    fleet = connect_or_exit(world_or_exit(), reading=True)
    run = find_run_or_exit(fleet, run_id)
    if node:
        node_logs(fleet, run.run_id, follow, as_json)
        return
    last = "0"
    for sid, event in events.read_run(fleet.redis, run.run_id):
        last = sid
        print(event.model_dump_json() if as_json else describe(event), flush=True)
    if not follow or fleet.ledger.get_run(run.run_id).state.is_terminal():
        return
    for event in events.follow_run(fleet.redis, run.run_id, after=last):
        print(event.model_dump_json() if as_json else describe(event), flush=True)
        if event.type in TERMINAL_EVENTS:
            return


def node_logs(fleet: svc.Fleet, run_id: str, follow: bool, as_json: bool) -> None:
    """Each of the run's Ray jobs' output as kept so far (state.nodelogs), under a line naming the job (with
    --json: one {"ray_job", "output"} object a line); with `follow`, what comes next, until the run ends."""
    shown: dict[str, int] = {}
    while True:
        ended = fleet.ledger.get_run(run_id).state.is_terminal()  # read before the logs: none is missed
        for sid, text in nodelogs.read(fleet.redis, run_id):
            start = min(shown.get(sid, 0), len(text))  # a long log's start may have been let go
            if new := text[start:]:
                if as_json:
                    print(json.dumps({"ray_job": sid, "output": new}), flush=True)
                else:
                    print(nodelogs.heading(sid) if start == 0 else "", new, sep="", end="", flush=True)
            shown[sid] = len(text)
        if not follow or ended:
            return
        time.sleep(1.0)


@cli.command()
def cancel(
    run_id: Annotated[str, typer.Argument(help="A run or sweep id (or a unique prefix).")],
    wait: Annotated[bool, typer.Option(help="Wait until the run has ended.")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait.")] = 120.0,
    as_json: JsonOpt = False,
) -> None:
    """Cancel a run (its Ray job is stopped and its node terminated), or every run of a sweep."""
    fleet = connect_or_exit(world_or_exit())
    if run_id.startswith(SWEEP_PREFIX):
        cli_sweep.cancel(fleet, run_id, as_json)
        return
    run = find_run_or_exit(fleet, run_id)
    run = svc.cancel(fleet, run.run_id)
    stage = run.state.stage
    if wait and stage is not None and not svc.serves(fleet, stage):
        err.print(
            f"no worker serves {stage.value}: the cancel is recorded; `fleet up` finishes it", markup=False
        )
        wait = False
    if wait and not run.state.is_terminal():
        events.wait_for(fleet.redis, run.run_id, TERMINAL_EVENTS, timeout)
        run = fleet.ledger.get_run(run.run_id)
    if as_json:
        out.print_json(run_view(fleet, run).model_dump_json())
    else:
        out.print(f"{run.run_id} {run.state.value}", highlight=False)
    if wait and not run.state.is_terminal():
        raise typer.Exit(1)


cli_procs.register(cli)
cli_status.register(cli)
cli_nodes.register(cli)
cli_offers.register(cli)
cli_sweep.register(cli)
cli_watch.register(cli)
cli_ops.register(cli)


def _redis_at() -> str:
    """` at <the settings' Redis URL, its password masked>`, or nothing (the embedded Redis, or settings that
    cannot be read)."""
    try:
        url = World.load().settings.redis_url
    except ConfigError:
        return ""
    return f" at {redisurl.shown(url)}" if url else ""


def main() -> None:
    try:
        cli()
    except FleetError as exc:
        err.print(f"error: {exc}", style="red", markup=False, highlight=False)
        sys.exit(2)
    except (redis.ConnectionError, redis.TimeoutError) as exc:  # the fleet's Redis went away, or never was
        why = f"error: the fleet's Redis{_redis_at()} does not answer ({exc}). Is it running? "
        why += "REDIS_URL names it; "
        why += "without one, the embedded Redis under FLEET_HOME is started for you."
        err.print(why, style="red", markup=False, highlight=False)
        sys.exit(1)  # what was asked did not happen; 2 is for a command that cannot start (README)
