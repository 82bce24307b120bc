"""Node-side model download: one connection against many, for one large safetensors file, with and without
a cap on the node's whole link, in one run.

A local Hub fake (tests.fakes.FakeHub) caps every download connection at `--throttle` MB/s, as a CDN edge
caps one connection. A real node also has a link: all its connections share one budget, however many it
opens. So the parallel fetch is timed twice: under the per-connection cap only (what a node whose link
never fills would see: the downloader's ceiling), and under the per-connection cap AND a `--link` MB/s
cap on all connections together (one token bucket across them, the fake's `link_bps`): the figure a
user would see on a node whose link is `--link / --throttle` times one connection's rate. The fake serves
a model repo: one `--size-mb` model.safetensors of random bytes plus config and tokenizer files.
trainer.download fetches the repo into a fresh cache each time: (a) on one connection (no link cap),
(b) on `--connections` connections, per-connection cap only, (c) the same under the link cap (and one
connection under the link cap too, when the link is slower than one connection). Speedups are (a)/(b)
and (a')/(c).

What it leaves out: it runs on loopback (no round-trip time, no TCP slow start, no packet loss), so the
caps are the only limits; with both caps the speedup tends to link / throttle (the caps' ratio). The times
cover listing, every request and the checks (sha256) as `snapshot` reports them, on this machine's CPUs.

    .venv/bin/python bench/download.py [--size-mb 200] [--throttle 4] [--link 16] [--connections 16]

The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fakes import FakeHub  # noqa: E402
from trainer.download import DownloadStats, HubAccess, model_files, snapshot  # noqa: E402

TOKEN = "bench-token"
REPO_ID = "bench/model"
SMALL_FILES = {
    "config.json": b'{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32}',
    "generation_config.json": b'{"do_sample": false}',
    "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}',
    "tokenizer_config.json": b'{"model_max_length": 4096}',
    "special_tokens_map.json": b'{"bos_token": "<s>"}',
}


def random_file(path: Path, size: int) -> Path:
    """`size` random bytes written in 8 MiB pieces (never the whole file in memory)."""
    with open(path, "wb") as out:
        left = size
        while left:
            piece = os.urandom(min(left, 8 * 1024 * 1024))
            out.write(piece)
            left -= len(piece)
    return path


def fetch(hub: FakeHub, cache: Path, connections: int, link_bps: float | None) -> DownloadStats:
    """The repo into a fresh cache on `connections` connections, with the hub's link capped at `link_bps`
    (None: no cap) for this fetch."""
    hub.set_link(link_bps)
    access = HubAccess(endpoint=hub.url, token=TOKEN, connections=connections)
    got = snapshot(REPO_ID, cache, access, "model", model_files)
    link = "no link cap" if link_bps is None else f"link {link_bps / 1e6:g} MB/s"
    print(
        f"  {connections:>2} connection(s), {link}: {got.stats.bytes / 1e6:.1f} MB "
        f"in {got.stats.seconds:.2f} s ({got.stats.mb_per_s:.1f} MB/s, {got.stats.requests} requests, "
        f"peak {got.stats.connections} connections, {got.stats.retries} retries)",
        flush=True,
    )
    return got.stats


def measure(args: argparse.Namespace, work: Path) -> dict[str, DownloadStats]:
    """The fetches, each into its own cache: single (a), parallel (b), parallel under the link cap (c), and
    single under the link cap when the link is slower than one connection."""
    size = int(args.size_mb * 1e6)
    link = args.link * 1e6
    print(f"seeding a {size / 1e6:.0f} MB model repo in the Hub fake ({work})", flush=True)
    weights = random_file(work / "model.safetensors", size)
    with FakeHub(home=work / "hub", token=TOKEN, throttle_bps=args.throttle * 1e6) as hub:
        hub.put_files(REPO_ID, {"model.safetensors": weights, **SMALL_FILES})
        weights.unlink()  # the fake keeps its own copy
        print(f"caps: {args.throttle:g} MB/s per connection; link {args.link:g} MB/s in all", flush=True)
        got = {
            "single": fetch(hub, work / "single", 1, None),
            "parallel": fetch(hub, work / "parallel", args.connections, None),
            "parallel_link": fetch(hub, work / "parallel-link", args.connections, link),
        }
        if args.link < args.throttle:  # one connection is then held back by the link too
            got["single_link"] = fetch(hub, work / "single-link", 1, link)
        else:
            got["single_link"] = got["single"]
            print(f"  (one connection under the {args.link:g} MB/s link: as without, it stays under it)")
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=200.0, help="size of model.safetensors (MB)")
    parser.add_argument("--throttle", type=float, default=4.0, help="MB/s per download connection")
    parser.add_argument("--link", type=float, default=16.0, help="MB/s of all connections together")
    parser.add_argument("--connections", type=int, default=16, help="connections of the parallel run")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    args = parser.parse_args()
    if min(args.size_mb, args.throttle, args.link, args.connections) <= 0:
        parser.error("--size-mb, --throttle, --link and --connections must be positive")

    work = Path(tempfile.mkdtemp(prefix="tf-bench-download-"))
    try:
        got = measure(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    single, parallel, linked = got["single"], got["parallel"], got["parallel_link"]
    ratio = single.seconds / parallel.seconds
    ratio_link = got["single_link"].seconds / linked.seconds
    result = {
        "size_mb": round(args.size_mb, 1),
        "throttle_mb_per_s": args.throttle,
        "link_mb_per_s": args.link,
        "connections": args.connections,
        "single_s": round(single.seconds, 2),
        "parallel_s": round(parallel.seconds, 2),
        "parallel_link_s": round(linked.seconds, 2),
        "ratio_per_connection_cap_only": round(ratio, 2),
        "ratio_under_link_cap": round(ratio_link, 2),
        "link_over_throttle": round(args.link / args.throttle, 2),
        "single_mb_per_s": round(single.mb_per_s, 1),
        "parallel_mb_per_s": round(parallel.mb_per_s, 1),
        "parallel_link_mb_per_s": round(linked.mb_per_s, 1),
        "parallel_peak_connections": parallel.connections,
        "parallel_requests": parallel.requests,
        "goal": 5.0,
        "goal_applies_to": "ratio_per_connection_cap_only (the downloader's own ceiling)",
        "leaves_out": "loopback: no round-trip time, TCP slow start or loss; the caps are the only limits",
    }
    print(f"single / parallel ({args.connections} connections), per-connection cap only: {ratio:.1f}x")
    print(
        f"single / parallel under a {args.link:g} MB/s link ({args.link / args.throttle:.1f}x one "
        f"connection's {args.throttle:g} MB/s): {ratio_link:.1f}x  <- what a user with such a link sees"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
