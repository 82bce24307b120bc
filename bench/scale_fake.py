"""One fake cloud with replay nodes, served in its own process for bench/scale.py.

As `python -m tests.fakes serve VENDOR --nodes replay` does, plus what a load bench needs of it: how long
each replayed train job runs, and (vast.ai) a catalogue as deep as the bench is wide. The fake vast.ai
rents each offer to one instance at a time, as vast.ai does, and lists eight; here its RTX A5000 offer is
cloned `--offers` times (same host type and price, each its own machine), so N runs at once find capacity.
RunPod's fake has no such limit. Prints the base URL as its first line, serves until SIGTERM or SIGINT.

    .venv/bin/python bench/scale_fake.py runpod|vastai --home DIR --api-key KEY [--train-seconds 4]
        [--boot-seconds 3] [--offers 200]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:] = [
    str(REPO),
    *(p for p in sys.path if Path(p or ".").resolve() not in (REPO, Path(__file__).resolve().parent)),
]

from tests.fakes import FAKES, FakeVastAI  # noqa: E402

VAST_OFFER = 1001  # the fake's RTX A5000: what the bench's vast.ai section rents
CLONE_IDS = 500_001  # the clones' offer ids start here


def clone_offers(fake: FakeVastAI, count: int) -> None:
    """`count` more offers like VAST_OFFER, each on its own machine."""
    base: dict[str, Any] = fake.offers[VAST_OFFER]
    with fake.lock:
        for i in range(count):
            offer_id = CLONE_IDS + i
            fake.offers[offer_id] = {**base, "id": offer_id, "machine_id": offer_id + 5000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vendor", choices=sorted(FAKES))
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--train-seconds", type=float, default=4.0)
    parser.add_argument("--boot-seconds", type=float, default=3.0, help="an instance's time to RUNNING")
    parser.add_argument("--offers", type=int, default=200, help="vast.ai: clones of the A5000 offer")
    args = parser.parse_args()
    fake = FAKES[args.vendor](
        api_key=args.api_key, home=args.home, nodes="replay", ready_delay_s=args.boot_seconds
    )
    fake.nodes.replayer.train_s = args.train_seconds  # type: ignore[attr-defined]
    if isinstance(fake, FakeVastAI):
        clone_offers(fake, args.offers)
    fake.serve_until_signalled()


if __name__ == "__main__":
    main()
