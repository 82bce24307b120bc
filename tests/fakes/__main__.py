"""`python -m tests.fakes serve runpod|vastai|hub|discord|wandb --port N [--home DIR] [options]`.

Clouds take `--nodes ray|stub|replay|none`, `--api-key`, `--ready-delay`, `--node-cpus`; the Hub takes
`--token`, `--throttle BYTES_PER_S` (each connection) and `--link BYTES_PER_S` (all connections together);
Discord takes `--token` (the bot token) and `--channel ID` (a text channel made at start, for the
notifier); W&B takes `--api-key` (default: its DEFAULT_KEY, 40 f's; its user is `tester`). Prints the base
URL as its first line, then the settings that point the fleet (or the vendor's own client) at it as
`export NAME=value` lines (tests.fakes.serving), serves until SIGTERM or SIGINT, then stops any nodes it
started.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from jobs.clouds import ProviderName
from providers.registry import PROVIDERS, api_url_setting
from tests.fakes import FAKES, FakeCloud, FakeDiscord, FakeHub, FakeRunPod
from tests.fakes.discord import DEFAULT_TOKEN as DISCORD_TOKEN
from tests.fakes.hub import DEFAULT_TOKEN
from tests.fakes.wandb import DEFAULT_KEY as WANDB_KEY
from tests.fakes.wandb import FakeWandb

Fake = FakeCloud | FakeHub | FakeDiscord | FakeWandb


def parser() -> argparse.ArgumentParser:
    """The command line: `serve VENDOR` and each vendor's options."""
    parser = argparse.ArgumentParser(prog="python -m tests.fakes")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve one fake cloud API, or the fake Hugging Face Hub")
    serve.add_argument("vendor", choices=[*sorted(FAKES), "hub", "discord", "wandb"])
    serve.add_argument("--port", type=int, default=0)
    serve.add_argument("--home", type=Path, default=None, help="where nodes (or the Hub's files) are kept")
    clouds = serve.add_argument_group("clouds (runpod, vastai)")
    clouds.add_argument("--nodes", choices=("ray", "stub", "replay", "none"), default="none")
    clouds.add_argument("--api-key", default=os.environ.get("FAKE_API_KEY"), help="(W&B's too)")
    clouds.add_argument(
        "--ready-delay", type=float, default=0.2, help="seconds to RUNNING (nodes none|stub|replay)"
    )
    clouds.add_argument("--node-cpus", type=int, default=1, help="CPUs of each node's Ray head (--nodes ray)")
    hub = serve.add_argument_group("hub, discord")
    hub.add_argument(
        "--token", default=None, help="the one valid token (Hub access token, Discord bot token)"
    )
    hub.add_argument("--throttle", type=float, default=None, help="bytes/s per download connection")
    hub.add_argument("--link", type=float, default=None, help="bytes/s of all downloads together")
    hub.add_argument(
        "--channel", type=int, default=None, help="Discord: a text channel to create (the notifier's)"
    )
    return parser


def make_fake(args: argparse.Namespace) -> Fake:
    """The fake that `args` asks for, not yet started."""
    if args.vendor == "wandb":  # keeps its runs in memory
        return FakeWandb(api_key=args.api_key or WANDB_KEY, port=args.port)
    if args.vendor == "discord":  # keeps everything in memory; --home is not used
        token = args.token or os.environ.get("FAKE_DISCORD_TOKEN", DISCORD_TOKEN)
        discord = FakeDiscord(token=token, port=args.port)
        if args.channel is not None:
            discord.add_channel(args.channel)
        return discord
    if args.vendor == "hub":  # without --home, the Hub keeps its files in a temporary directory it removes
        token = args.token or os.environ.get("FAKE_HUB_TOKEN", DEFAULT_TOKEN)
        return FakeHub(
            home=args.home, token=token, throttle_bps=args.throttle, port=args.port, link_bps=args.link
        )
    return FAKES[args.vendor](
        api_key=args.api_key or "test-key",
        home=args.home or Path(tempfile.mkdtemp(prefix=f"fake-{args.vendor}-")),
        nodes=args.nodes,
        ready_delay_s=args.ready_delay,
        port=args.port,
        node_cpus=args.node_cpus,
    )


def settings_for(fake: Fake, args: argparse.Namespace) -> dict[str, str]:
    """The environment that points the fleet (or the vendor's own client) at the started `fake`: the names
    the fleet reads (core.settings: AS_IS, a cloud's CloudSettings, FLEET_*; core.secrets), with this
    fake's values."""
    if isinstance(fake, FakeWandb):
        return {"WANDB_BASE_URL": fake.url, "WANDB_API_KEY": args.api_key or WANDB_KEY}
    if isinstance(fake, FakeDiscord):
        found = {"FLEET_DISCORD_API_BASE": f"{fake.url}/api/v10", "FLEET_DISCORD_BOT_TOKEN": fake.token}
        channel = args.channel
        return found | ({} if channel is None else {"FLEET_DISCORD_CHANNEL_ID": str(channel)})
    if isinstance(fake, FakeHub):
        return {"HF_ENDPOINT": fake.url, "HF_HUB_DISABLE_XET": "1", "HF_TOKEN": fake.token}
    provider = PROVIDERS[ProviderName(args.vendor)]  # the names the fleet reads for this cloud
    model, field = provider.settings_model, api_url_setting(provider)
    if model is None or field is None:
        raise RuntimeError(f"{provider.__name__} has no API URL setting: the fleet cannot be pointed at it")
    url_env = model.AS_IS.get(field, f"FLEET_{field.upper()}")
    found = {url_env: fake.url} | dict.fromkeys(provider.credential_names, fake.api_key)
    if isinstance(fake, FakeRunPod):  # its pods' ports only through its HTTPS proxy, as RunPod's
        found |= fake.proxy.settings() | {"FLEET_RUNPOD_REST_URL": fake.rest_url}
    return found


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and serve one fake until a signal arrives."""
    args = parser().parse_args(argv)
    fake = make_fake(args)
    fake.serve_until_signalled(lambda: settings_for(fake, args))
    print("stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
