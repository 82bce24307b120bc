"""Node-side model download: one connection against many, for one large safetensors file, in one run.

A local Hub fake (tests.fakes.FakeHub) caps every download connection at `--throttle` MB/s, as a CDN
edge or a node's share of it does. It serves a model repo: one `--size-mb` model.safetensors of random
bytes plus config and tokenizer files. trainer.download fetches the repo twice, each time into a fresh
cache: (a) on one connection, (b) on `--connections` connections (byte ranges of the one big file in
parallel). The figure is the ratio of the two times; the goal is 5x or better with 8+ connections.

    .venv/bin/python bench/download.py [--size-mb 200] [--throttle 4] [--connections 16]

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


def fetch(hub: FakeHub, cache: Path, connections: int) -> DownloadStats:
    access = HubAccess(endpoint=hub.url, token=TOKEN, connections=connections)
    got = snapshot(REPO_ID, cache, access, "model", model_files)
    print(
        f"  {connections:>2} connection(s): {got.stats.bytes / 1e6:.1f} MB in {got.stats.seconds:.2f} s "
        f"({got.stats.mb_per_s:.1f} MB/s, {got.stats.requests} requests, peak {got.stats.connections} "
        f"connections, {got.stats.retries} retries)",
        flush=True,
    )
    return got.stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=200.0, help="size of model.safetensors (MB)")
    parser.add_argument("--throttle", type=float, default=4.0, help="MB/s per download connection")
    parser.add_argument("--connections", type=int, default=16, help="connections of the parallel run")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tf-bench-download-"))
    size = int(args.size_mb * 1e6)
    try:
        print(f"seeding a {size / 1e6:.0f} MB model repo in the Hub fake ({work})", flush=True)
        weights = random_file(work / "model.safetensors", size)
        with FakeHub(home=work / "hub", token=TOKEN, throttle_bps=args.throttle * 1e6) as hub:
            hub.put_files(REPO_ID, {"model.safetensors": weights, **SMALL_FILES})
            weights.unlink()  # the fake keeps its own copy
            print(f"throttle: {args.throttle:g} MB/s per connection", flush=True)
            single = fetch(hub, work / "single", 1)
            parallel = fetch(hub, work / "parallel", args.connections)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    ratio = single.seconds / parallel.seconds
    result = {
        "size_mb": round(size / 1e6, 1),
        "throttle_mb_per_s": args.throttle,
        "connections": args.connections,
        "single_s": round(single.seconds, 2),
        "parallel_s": round(parallel.seconds, 2),
        "ratio": round(ratio, 2),
        "single_mb_per_s": round(single.mb_per_s, 1),
        "parallel_mb_per_s": round(parallel.mb_per_s, 1),
        "parallel_peak_connections": parallel.connections,
        "parallel_requests": parallel.requests,
        "goal": 5.0,
    }
    print(f"single / parallel ({args.connections} connections): {ratio:.1f}x")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
