"""`python -m tests.fakes serve runpod|vastai|hub|discord|wandb --port N [--home DIR] [options]`.

Clouds take `--nodes ray|stub|replay|none`, `--api-key`, `--ready-delay`, `--node-cpus`; the Hub takes
`--token` and `--throttle BYTES_PER_S`; Discord takes `--token` (the bot token); W&B takes `--api-key`
(default: its DEFAULT_KEY, 40 f's; its user is `tester`). Prints the base URL as its
first line, serves until SIGTERM or SIGINT, then stops any nodes it started.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from tests.fakes import FAKES, FakeCloud, FakeDiscord, FakeHub
from tests.fakes.discord import DEFAULT_TOKEN as DISCORD_TOKEN
from tests.fakes.hub import DEFAULT_TOKEN
from tests.fakes.wandb import DEFAULT_KEY as WANDB_KEY
from tests.fakes.wandb import FakeWandb


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and serve one fake until a signal arrives."""
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
    args = parser.parse_args(argv)

    fake: FakeCloud | FakeHub | FakeDiscord | FakeWandb
    if args.vendor == "wandb":  # keeps its runs in memory
        fake = FakeWandb(api_key=args.api_key or WANDB_KEY, port=args.port)
    elif args.vendor == "discord":  # keeps everything in memory; --home is not used
        fake = FakeDiscord(
            token=args.token or os.environ.get("FAKE_DISCORD_TOKEN", DISCORD_TOKEN), port=args.port
        )
    elif args.vendor == "hub":  # without --home, the Hub keeps its files in a temporary directory it removes
        token = args.token or os.environ.get("FAKE_HUB_TOKEN", DEFAULT_TOKEN)
        fake = FakeHub(home=args.home, token=token, throttle_bps=args.throttle, port=args.port)
    else:
        fake = FAKES[args.vendor](
            api_key=args.api_key or "test-key",
            home=args.home or Path(tempfile.mkdtemp(prefix=f"fake-{args.vendor}-")),
            nodes=args.nodes,
            ready_delay_s=args.ready_delay,
            port=args.port,
            node_cpus=args.node_cpus,
        )
    fake.serve_until_signalled()
    print("stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
