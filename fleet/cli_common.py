"""What every `fleet` command shares: the consoles, the --json option, settings and the connection."""

from __future__ import annotations

import atexit
import os
import sys
from typing import Annotated, TextIO

import typer
from rich.console import Console

from core.errors import ConfigError, FleetError
from core.secrets import Secrets
from core.settings import Settings
from jobs.spec import format_problems
from providers.world import World
from service import embedded, runs
from state.models import Run

PIPE_WIDTH = 400  # a table printed into a pipe or file: as wide as its cells, not cut at rich's 80 columns


def _width(stream: TextIO) -> int | None:
    """None (the terminal's width, or COLUMNS) on a terminal or where COLUMNS says; else PIPE_WIDTH."""
    return None if stream.isatty() or os.environ.get("COLUMNS") else PIPE_WIDTH


# emoji=False: rich would print ":cd:" in a certificate's fingerprint (8A:CD:CC) as an emoji; what the fleet
# prints (fingerprints, ids, paths, the user's own values) is printed as it is.
out = Console(soft_wrap=True, width=_width(sys.stdout), emoji=False)
err = Console(stderr=True, soft_wrap=True, width=_width(sys.stderr), emoji=False)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def world_or_exit() -> World:
    """This process's world (providers.world): its settings, or exit 2 with every problem listed."""
    try:
        return World.load()
    except ConfigError as exc:
        err.print("invalid settings", style="red")
        err.print(format_problems(exc), markup=False, highlight=False)
        raise typer.Exit(2) from None


def settings_or_exit() -> Settings:
    """The settings, or exit 2 with every problem listed."""
    return world_or_exit().settings


def secrets_or_exit(world: World) -> Secrets:
    """The world's secrets, or exit 2 saying why the secrets file cannot be read."""
    try:
        return world.secrets
    except ConfigError as exc:
        err.print("invalid secrets", style="red")
        err.print(format_problems(exc), markup=False, highlight=False)
        raise typer.Exit(2) from None


def connect_or_exit(world: World, reading: bool = False) -> runs.Fleet:
    """A connection to the fleet of `world` (starting the embedded Redis if needed), or exit saying why: 2
    for a REDIS_URL that is not valid, 1 for a Redis that cannot be reached or started. A command only
    `reading` the fleet (status, logs, plot, ...) that had to start the embedded Redis stops it again as it
    exits, unless someone else connected to it meanwhile: it leaves no server running."""
    settings = world.settings
    started = reading and settings.redis_url is None and not embedded.running(settings.home)
    try:
        fleet = runs.Fleet.connect(world)
    except FleetError as exc:
        err.print(str(exc), style="red", markup=False, highlight=False)
        raise typer.Exit(2 if isinstance(exc, ConfigError) else 1) from None
    if started:
        atexit.register(embedded.stop_if_alone, settings.home, fleet.redis)
    return fleet


def find_run_or_exit(fleet: runs.Fleet, run_id: str) -> Run:
    """The run `run_id` names (or a unique prefix of it), or exit 1 saying why not."""
    try:
        return fleet.ledger.find_run(run_id)
    except FleetError as exc:
        err.print(str(exc), style="red", markup=False, highlight=False)
        raise typer.Exit(1) from None
