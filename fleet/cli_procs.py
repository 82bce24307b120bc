"""`fleet worker`, `beat`, `up`, `notify`, `bot` and `down`: the fleet's own processes, each run in the
foreground until Ctrl-C (the Celery worker and beat, a whole single-machine fleet, the Discord notifier and
bot), `down`, which stops the embedded Redis, and `health`, docker-compose's check of them.
"""

from __future__ import annotations

import contextlib
import enum
import signal
import socket
import threading
import time
import urllib.request
from typing import Annotated

import typer

from broker.queues import QUEUES
from fleet.cli_common import connect_or_exit, err, out, secrets_or_exit, settings_or_exit, world_or_exit
from state.keys import REAP_SEEN, alive_key

QueuesOpt = Annotated[str, typer.Option("--queues", "-Q", help="Comma-separated queues to consume.")]
ALL_QUEUES = ",".join(QUEUES)


def register(cli: typer.Typer) -> None:
    """Add these commands to the `fleet` app."""
    cli.command()(worker)
    cli.command()(beat)
    cli.command()(up)
    cli.command()(notify)
    cli.command()(bot)
    cli.command()(down)
    cli.command()(health)


def worker(
    queues: QueuesOpt = ALL_QUEUES,
    concurrency: Annotated[int | None, typer.Option("--concurrency", "-c", help="Worker processes.")] = None,
    beat: Annotated[bool, typer.Option(help="Also run the reaper's beat in this worker.")] = False,
) -> None:
    """Run a Celery worker for the given stage queues (foreground)."""
    from workers.process import run_worker

    world = world_or_exit()
    settings = world.settings
    fleet = connect_or_exit(world)
    chosen = [q.strip() for q in queues.split(",") if q.strip()]
    if unknown := [q for q in chosen if q not in QUEUES]:
        err.print(f"[red]unknown queue(s) {', '.join(unknown)}; valid: {', '.join(QUEUES)}[/red]")
        raise typer.Exit(2)
    run_worker(settings, fleet.redis_url, chosen, concurrency or settings.worker_concurrency, beat)


def beat() -> None:
    """Run celery beat, which sends the reaper every FLEET_REAP_INTERVAL_S seconds (foreground)."""
    from workers.process import run_beat

    world = world_or_exit()
    settings = world.settings
    run_beat(settings, connect_or_exit(world).redis_url)


def up() -> None:
    """A whole single-machine fleet in the foreground: one worker on every queue, plus beat."""
    from workers.process import run_worker

    world = world_or_exit()
    settings = world.settings
    fleet = connect_or_exit(world)
    err.print(f"fleet home {settings.home}; Ctrl-C to stop", highlight=False)
    run_worker(settings, fleet.redis_url, list(QUEUES), settings.worker_concurrency, beat=True)


def notify() -> None:
    """Post the fleet's events to Discord (foreground, until Ctrl-C): as the bot into
    FLEET_DISCORD_CHANNEL_ID when FLEET_DISCORD_BOT_TOKEN is set, else through FLEET_DISCORD_WEBHOOK_URL.
    One status message per run, edited in place, and a message for each result, failure and link; as the bot,
    in a thread of the run's own (one line per run in the channel)."""
    import requests

    from bot.app import bot_token
    from bot.notifier import Notifier, secret_values
    from bot.sinks import RestClient

    world = world_or_exit()
    settings, secrets = world.settings, secrets_or_exit(world)
    as_bot = secrets.get("FLEET_DISCORD_BOT_TOKEN") is not None and settings.discord_channel_id is not None
    if not as_bot and not settings.discord_webhook_url:
        err.print(
            "the notifier has nowhere to post: FLEET_DISCORD_WEBHOOK_URL is not set, nor "
            "FLEET_DISCORD_BOT_TOKEN with FLEET_DISCORD_CHANNEL_ID (to post as the bot)",
            style="red",
        )
        raise typer.Exit(2)
    fleet = connect_or_exit(world)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    with contextlib.ExitStack() as stack:
        if as_bot:
            import discord.http

            discord.http.Route.BASE = settings.discord_api_base.rstrip("/")
            rest = RestClient(bot_token(secrets))
            stack.callback(rest.close)
            assert settings.discord_channel_id is not None
            notifier = Notifier(fleet.redis, rest.sink(settings.discord_channel_id), secret_values(secrets))
        else:
            session = stack.enter_context(requests.Session())
            notifier = Notifier.from_settings(settings, fleet.redis, secrets, session)
        where = f"channel {settings.discord_channel_id} as the bot" if as_bot else "the webhook"
        err.print(f"notifier: posting to {where}; Ctrl-C to stop", highlight=False)
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: stop between batches, unacked ones stay
            notifier.run_forever(stop)


def bot() -> None:
    """The Discord bot (foreground, until Ctrl-C): slash commands for the allowlisted users and roles in the
    allowlisted channels, and the notifier posting into FLEET_DISCORD_CHANNEL_ID. Needs
    FLEET_DISCORD_BOT_TOKEN."""
    from bot.app import run_bot

    world = world_or_exit()
    settings, secrets = world.settings, secrets_or_exit(world)
    if secrets.get("FLEET_DISCORD_BOT_TOKEN") is None:
        err.print("FLEET_DISCORD_BOT_TOKEN is not set (environment or the fleet's secrets file)", style="red")
        raise typer.Exit(2)
    if (
        not (settings.discord_allowed_users or settings.discord_allowed_roles)
        or not settings.discord_allowed_channels
    ):
        err.print(
            "warning: the allowlists are empty, so the bot refuses everyone: set "
            "FLEET_DISCORD_ALLOWED_CHANNELS and FLEET_DISCORD_ALLOWED_USERS or FLEET_DISCORD_ALLOWED_ROLES",
            style="yellow",
        )
    channel = settings.discord_channel_id
    where = f"posting the fleet's events to channel {channel}" if channel else "no notify channel set"
    err.print(f"bot: slash commands for the allowlisted; {where}; Ctrl-C to stop", highlight=False)
    run_bot(connect_or_exit(world))


def down() -> None:
    """Stop the embedded Redis (the ledger stays on disk)."""
    from service.embedded import stop_redis

    settings = settings_or_exit()
    out.print("stopped" if stop_redis(settings.home) else "not running")


class Part(enum.StrEnum):
    worker = "worker"
    beat = "beat"
    flower = "flower"
    notifier = "notifier"
    bot = "bot"


def health(
    part: Annotated[Part, typer.Argument(help="What to check on this machine.")],
    port: Annotated[int, typer.Option(help="Flower's port.")] = 5555,
) -> None:
    """Exit 0 when this machine's PART works, else 1 saying why (docker-compose's healthchecks): worker, a
    worker here keeps its heartbeat in Redis; beat, a periodic reaper ran within three reap intervals (beat
    sent it, a reap worker ran it); flower, its /healthcheck answers OK; notifier, `fleet notify` here reads
    the events (it marks itself alive in Redis); bot, `fleet bot` here has its Discord gateway session up."""
    if part == Part.flower:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/healthcheck")
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                ok = answer.read() == b"OK"
        except OSError as exc:
            err.print(f"flower does not answer on 127.0.0.1:{port}: {exc}", markup=False)
            raise typer.Exit(1) from None
        raise typer.Exit(0 if ok else 1)
    world = world_or_exit()
    settings = world.settings
    fleet = connect_or_exit(world)
    if part in (Part.notifier, Part.bot):
        if not fleet.redis.exists(alive_key(part.value, socket.gethostname())):
            what = "marks itself alive" if part == Part.notifier else "has its gateway session up"
            err.print(f"no {part.value} on {socket.gethostname()} {what}", markup=False)
            raise typer.Exit(1)
        return
    if part == Part.worker:
        from workers.process import served_queues

        served = served_queues(fleet.redis, socket.gethostname())
        if not served:
            err.print(f"no worker on {socket.gethostname()} keeps its heartbeat", markup=False)
            raise typer.Exit(1)
        out.print(f"worker serves {', '.join(sorted(served))}", highlight=False)
        return
    seen = fleet.redis.get(REAP_SEEN)
    age = time.time() - float(seen) if seen else None
    if age is None or age > 3 * settings.reap_interval_s + 30:
        when = f"{age:.0f} s ago" if age is not None else "never"
        err.print(f"the periodic reaper last ran {when} (every {settings.reap_interval_s:g} s)", markup=False)
        raise typer.Exit(1)
    out.print(f"the periodic reaper ran {age:.0f} s ago", highlight=False)
