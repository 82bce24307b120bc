"""`fleet flower`: Celery Flower on the fleet's own Celery app, to follow runs' stage tasks (by name, with
their run id) in a browser or through Flower's HTTP API.

Flower 2 refuses its HTTP API without authentication unless FLOWER_UNAUTHENTICATED_API is set. Bound to
this machine (the default, 127.0.0.1) the API is enabled without a password; bound anywhere else, Flower
must be given FLOWER_BASIC_AUTH (`user:password`, comma-separated for more) or FLOWER_AUTH (its OAuth
email pattern) in the environment, or `--no-auth` (behind a proxy that authenticates). Credentials are
only ever read from the environment (a command line shows in `ps`) and never printed.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import typer

from fleet.cli_common import connect_or_exit, err, settings_or_exit

# Flower reads these itself (every FLOWER_<option> variable is one of its options).
BASIC_AUTH_ENV = "FLOWER_BASIC_AUTH"
OAUTH_ENV = "FLOWER_AUTH"
OPEN_API_ENV = "FLOWER_UNAUTHENTICATED_API"
STATE_SAVE_INTERVAL_MS = 60_000


def register(cli: typer.Typer) -> None:
    """Add these commands to the `fleet` app."""
    cli.command()(flower)


def flower(
    port: Annotated[int, typer.Option(help="Port of Flower's web UI and HTTP API.", min=1, max=65535)] = 5555,
    address: Annotated[
        str,
        typer.Option(
            help="Address to bind; beyond this machine (e.g. 0.0.0.0) needs FLOWER_BASIC_AUTH or --no-auth."
        ),
    ] = "127.0.0.1",
    persistent: Annotated[
        bool,
        typer.Option(help="Keep Flower's task history across restarts, in <fleet home>/flower/flower.db."),
    ] = False,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth", help="Serve without a password on any address (behind a proxy that authenticates)."
        ),
    ] = False,
) -> None:
    """Celery Flower on the fleet (foreground, until Ctrl-C): every stage task by name (trainfleet.provision,
    ...) with its run id, state and worker, in a browser and at /api/tasks."""
    try:
        access = decide_access(address, os.environ, no_auth=no_auth)
    except ValueError as exc:
        err.print(str(exc), style="red", markup=False, highlight=False)
        raise typer.Exit(2) from None
    settings = settings_or_exit()
    fleet = connect_or_exit(settings)
    if access != "auth":
        # Read by Flower on each API request, in this process only.
        os.environ[OPEN_API_ENV] = "true"
    from broker.app import configure

    app = configure(settings, fleet.redis_url)
    where = f"http://{address or '0.0.0.0'}:{port}"
    shown = {"open-api": "API open to this machine", "auth": "password required", "no-auth": "NO password"}
    err.print(f"flower: {where} ({shown[access]}); Ctrl-C to stop", highlight=False)
    try:
        app.start(flower_argv(settings.home, port, address, persistent=persistent))
    except OSError as exc:  # the port is taken, or the address is not this machine's
        err.print(f"flower cannot listen on {address}:{port}: {exc.strerror or exc}", style="red")
        raise typer.Exit(1) from None


def is_local(address: str) -> bool:
    """Whether binding `address` serves this machine only (a loopback address or `localhost`)."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # a host name, or "" (every interface)


def decide_access(address: str, environ: Mapping[str, str], *, no_auth: bool) -> str:
    """How Flower is guarded: "auth" (Flower checks FLOWER_BASIC_AUTH or FLOWER_AUTH), "open-api" (bound to
    this machine: its API is enabled without a password) or "no-auth" (asked for on another address).
    Raises ValueError, without quoting any credential, when the choice is unsafe or the setting malformed."""
    basic = environ.get(BASIC_AUTH_ENV, "")
    if basic:
        for entry in basic.split(","):
            user, colon, password = entry.partition(":")
            if not (user and colon and password):
                raise ValueError(f"{BASIC_AUTH_ENV} must be user:password (comma-separated for more)")
        return "auth"
    if environ.get(OAUTH_ENV):
        return "auth"
    if is_local(address):
        return "open-api"
    if no_auth:
        return "no-auth"
    raise ValueError(
        f"flower on {address or 'every interface'} needs {BASIC_AUTH_ENV}=user:password in the environment "
        "(or --no-auth behind a proxy that authenticates)"
    )


def flower_argv(home: Path, port: int, address: str, *, persistent: bool) -> list[str]:
    """`celery flower` arguments. Its config file is looked for under the fleet home (Flower would execute a
    flowerconfig.py from the working directory otherwise), and so is its state file."""
    state = home / "flower"
    state.mkdir(parents=True, exist_ok=True)
    argv = ["flower", f"--port={port}", f"--address={address}", f"--conf={state / 'flowerconfig.py'}"]
    if persistent:
        argv += [
            "--persistent=True",
            f"--db={state / 'flower.db'}",
            f"--state_save_interval={STATE_SAVE_INTERVAL_MS}",
        ]
    return argv
