"""`python -m tests.fakes serve runpod|vastai --port N [--home DIR] [--nodes ray|none]`.

Prints the base URL as its first line, serves until SIGTERM or SIGINT, then stops any nodes it started.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType

from tests.fakes import FAKES


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and serve one fake until a signal arrives."""
    parser = argparse.ArgumentParser(prog="python -m tests.fakes")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve one fake cloud API")
    serve.add_argument("vendor", choices=sorted(FAKES))
    serve.add_argument("--port", type=int, default=0)
    serve.add_argument("--home", type=Path, default=None, help="where nodes keep their files")
    serve.add_argument("--nodes", choices=("ray", "none"), default="none")
    serve.add_argument("--api-key", default=os.environ.get("FAKE_API_KEY", "test-key"))
    serve.add_argument("--ready-delay", type=float, default=0.2, help="seconds to RUNNING with --nodes none")
    serve.add_argument("--node-cpus", type=int, default=1, help="CPUs of each node's Ray head (--nodes ray)")
    args = parser.parse_args(argv)

    home = args.home or Path(tempfile.mkdtemp(prefix=f"fake-{args.vendor}-"))
    fake = FAKES[args.vendor](
        api_key=args.api_key,
        home=home,
        nodes=args.nodes,
        ready_delay_s=args.ready_delay,
        port=args.port,
        node_cpus=args.node_cpus,
    )
    fake.start()
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(fake.url, flush=True)
    try:
        while not stopping.wait(0.5):
            pass
    finally:
        fake.stop()
    print("stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
