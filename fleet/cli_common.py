"""What every `fleet` command shares: the consoles, the --json option, settings and the connection."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from core.errors import ConfigError, FleetError
from core.settings import Settings, load_settings
from jobs.spec import format_problems
from service import runs

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def settings_or_exit() -> Settings:
    """The settings, or exit 2 with every problem listed."""
    try:
        return load_settings()
    except ConfigError as exc:
        err.print("invalid settings", style="red")
        err.print(format_problems(exc), markup=False, highlight=False)
        raise typer.Exit(2) from None


def connect_or_exit(settings: Settings) -> runs.Fleet:
    """A connection to the fleet (starting the embedded Redis if needed), or exit 2 saying why."""
    try:
        return runs.Fleet.connect(settings)
    except FleetError as exc:
        err.print(str(exc), style="red", markup=False, highlight=False)
        raise typer.Exit(2) from None
