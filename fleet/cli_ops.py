"""`fleet flower`: Celery Flower on the fleet's own Celery app, to follow runs' stage tasks (by name, with
their run id) in a browser or through Flower's HTTP API.

Flower can send, revoke and shut down tasks and workers, so it always asks for a password and answers only
under its own Host names (service.flower_guard): a web page in the user's browser can neither rebind a
name to it nor post to it across sites. The password is `FLOWER_BASIC_AUTH` (user:password) when set in
the environment, else one generated on the first start, printed that once with its user name, and kept in
`<fleet home>/flower/basic-auth` (0600); later starts say where it is (service.flower_auth). It never
travels on a command line.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from core.errors import ConfigError
from fleet.cli_common import connect_or_exit, err, world_or_exit
from service.flower_auth import FlowerAuth, flower_auth
from service.flower_guard import FlowerServe, Guard, allowed_hosts


def register(cli: typer.Typer) -> None:
    """Add these commands to the `fleet` app."""
    cli.command()(flower)
    cli.command("seal-key")(seal_key)


def flower(
    port: Annotated[int, typer.Option(help="Port of Flower's web UI and HTTP API.", min=1, max=65535)] = 5555,
    address: Annotated[
        str, typer.Option(help="Address to bind; on every interface (0.0.0.0) name its --host too.")
    ] = "127.0.0.1",
    persistent: Annotated[
        bool,
        typer.Option(help="Keep Flower's task history across restarts, in <fleet home>/flower/flower.db."),
    ] = False,
    host: Annotated[
        list[str] | None,
        typer.Option(
            help="A name (NAME or NAME:PORT, or several comma-separated) browsers reach Flower by; requests "
            "under any other Host are refused. Loopback names are always allowed on 127.0.0.1."
        ),
    ] = None,
) -> None:
    """Celery Flower on the fleet (foreground, until Ctrl-C): every stage task by name (trainfleet.provision,
    ...) with its run id, state and worker, in a browser and at /api/tasks (basic auth)."""
    names = [name for given in host or [] for name in given.split(",")]
    try:
        hosts = allowed_hosts(address, port, names)
    except ValueError as exc:
        err.print(str(exc), style="red", markup=False, highlight=False)
        raise typer.Exit(2) from None
    world = world_or_exit()
    settings = world.settings
    state_dir = settings.home / "flower"
    try:
        auth = flower_auth(state_dir, os.environ)
    except ConfigError as exc:
        err.print(str(exc), style="red", markup=False, highlight=False)
        raise typer.Exit(2) from None
    fleet = connect_or_exit(world)
    from broker.app import configure
    from service.flower_guard import serve

    app = configure(settings, fleet.redis_url)
    announce(auth)
    shown = ", ".join(sorted(hosts))
    err.print(f"flower: http://{address or '0.0.0.0'}:{port} (as {shown}); Ctrl-C to stop", highlight=False)
    guard = Guard(hosts, tuple(auth.plain()))
    try:
        serve(app, FlowerServe(port, address, state_dir, persistent), guard)
    except OSError as exc:  # the port is taken, or the address is not this machine's
        err.print(f"flower cannot listen on {address}:{port}: {exc.strerror or exc}", style="red")
        raise typer.Exit(1) from None


def announce(auth: FlowerAuth) -> None:
    """Say how to log in: the password itself only when it was made just now (the one time it is shown),
    else where it is kept."""
    if auth.created:
        password = auth.plain()[0].partition(":")[2]
        err.print(
            f"flower: user {auth.user}, password {password}\n"
            f"flower: shown this once; kept in {auth.source} (owner-only)",
            markup=False,
            highlight=False,
        )
    else:
        err.print(
            f"flower: user {auth.user}; the password is in {auth.source}", markup=False, highlight=False
        )


def seal_key() -> None:
    """Print this machine's seal key (made now if it has none): the key that seals the nodes' tokens in the
    fleet's Redis. Set it as FLEET_SEAL_KEY on every other machine whose workers share this fleet."""
    from providers.sealed import SEAL_KEY
    from providers.sealed import seal_key as key_of

    world = world_or_exit()
    try:
        configured = world.secrets.get(SEAL_KEY)
        key, source = key_of(configured.get_secret_value() if configured else None, world.settings.home)
    except ConfigError as exc:
        err.print(str(exc), style="red", markup=False, highlight=False)
        raise typer.Exit(2) from None
    err.print(f"the seal key from {source}; a secret: keep it as you keep the cloud keys", highlight=False)
    print(key.decode())
