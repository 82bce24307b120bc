"""Notifier latency, event to Discord, under Discord's own rate limits, with and without injected 429s, side
by side in one run.

Two `fleet notify` processes post as the bot, each into its own fake Discord (tests.fakes.FakeDiscord,
served from this process) and each from its own database of one embedded redis-server. Two producer
threads move the same runs through the real Ledger (tests.factories.Script) at the same steady rate while
the notifiers run, so an event waits only for its notifier and for Discord. The runs go round-robin,
`--width` at a time; all alike, they end and start in waves of `--width`, as a sweep's runs do: a wave
of more than 5 uses up the channel's buckets, and its later runs' first events wait for the next window.

Both fakes keep Discord's per-route limits (tests.fakes.discord_limits): 5 requests per 5 s per channel
for creating messages, for editing them and for starting threads. A thread is a channel: each run's thread
has buckets of its own, while the channel's (the message each thread starts from, the thread starts) are
every run's. Discord documents the message limit; it publishes none for thread starts, and the bench
assumes the same 5 per 5 s there. discord.py reads the X-RateLimit-* headers and waits before it would go
over; a request over a limit gets Discord's 429. `--time-scale k` makes the windows k times shorter (5 per
5/k s): the scale is printed and in the JSON, and the figures are then not what a user sees (nor is the
goal judged). One side's fake also answers every `--every`-th message create, edit and thread start with
an injected 429 (Retry-After `--retry-after` s, with Via, as Discord's), which discord.py waits out and
retries.

Every event counts, each run's first as well (it starts the run's thread: the message in the channel, the
thread, then the status message in it). A run met a 429 when one (injected, or over a limit) was answered
in its thread, or on one of the channel's routes while its first event waited on them (from the event to
its thread's first message, the 429's Retry-After included: discord.py holds the route that long, so every
run starting meanwhile waits). The goal: p99 <= 1 s for the events of runs that met no 429, on each side.
Beside it: all events, each run's first event, how many runs met a 429.

An event's latency runs from its `time` (set as the ledger writes it) to the moment the fake recorded what
it caused: for an event with a message of its own (a result, a failure, a W&B link), that message's
creation; for any other, the first creation or edit after it of its run's status message, or of the board
while it lists the run (bot.board: a run waiting for its thread is listed on the newest thread-starting
message, an edit, a route its wait does not hold up).

Left out: Discord's global limit (50 requests/s per bot; the request rate is printed), the network to
Discord and its own time to answer (the fake is on loopback).

    .venv/bin/python bench/notify.py [--runs 40] [--rate 4] [--width 10] [--every 20] [--retry-after 0.5]
                                     [--time-scale 1]

The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import redis

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.notify_figures import SideFigures, figures, side_figures  # noqa: E402
from service.embedded import ensure_redis, stop_redis  # noqa: E402
from state.keys import EVENTS_STREAM  # noqa: E402
from state.keys import NOTIFIER_GROUP as GROUP  # noqa: E402
from tests.factories import Script  # noqa: E402
from tests.fakes import FakeDiscord  # noqa: E402
from tests.integration.fleetproc import fleet_env  # noqa: E402

TOKEN = "bench-bot-token"
CHANNEL = 423456789012345678
OPS = ("create_message", "edit_message", "start_thread")  # every request a run makes
# Discord's per-route limits, per channel (a run's thread is a channel of its own); thread starts assumed.
DISCORD_LIMITS = {op: (5, 5.0) for op in OPS}
GOAL_MS = 1000.0
ENDLESS = 10**6  # `times` of the 429 rules: they never run out
Step = Callable[[Script], None]


@dataclass
class Side:
    """One notifier with its own fake Discord and Redis database."""

    name: str
    fake: FakeDiscord
    redis_url: str
    client: redis.Redis[str] = field(init=False)
    proc: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.client = redis.Redis.from_url(self.redis_url, decode_responses=True)


def run_steps(run_id: str, fails: bool) -> list[Step]:
    """One run's life, a ledger change per step: 10 events when it succeeds, 9 when it fails."""
    return [
        lambda s: s.create(run_id),
        lambda s: s.to_training(run_id),
        *[(lambda s, n=n: s.steps(run_id, [n])) for n in (1, 2, 3)],
        (lambda s: s.fail(run_id, "CUDA out of memory")) if fails else (lambda s: s.succeed(run_id)),
    ]


def interleave(runs: list[list[Step]], width: int) -> Iterator[Step]:
    """Round-robin over `width` runs at a time, the next run starting as one ends: a busy fleet."""
    waiting, active = deque(deque(steps) for steps in runs), deque[deque[Step]]()
    while waiting or active:
        while waiting and len(active) < width:
            active.append(waiting.popleft())
        steps = active.popleft()
        yield steps.popleft()
        if steps:
            active.append(steps)


def produce(side: Side, steps: list[Step], rate: float) -> None:
    """Apply the steps, pacing on the events written so far so they arrive at `rate` per second."""
    script, start = Script(side.client), time.monotonic()
    for step in steps:
        step(script)
        ahead = start + side.client.xlen(EVENTS_STREAM) / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)


def start_notifier(side: Side, work: Path) -> None:
    env = fleet_env(
        work / "home",
        REDIS_URL=side.redis_url,
        FLEET_DISCORD_BOT_TOKEN=TOKEN,
        FLEET_DISCORD_CHANNEL_ID=str(CHANNEL),
        FLEET_DISCORD_API_BASE=f"{side.fake.url}/api/v10",
    )
    with open(work / f"notify-{side.name}.log", "wb") as log:
        side.proc = subprocess.Popen(
            [sys.executable, "-m", "fleet", "notify"], env=env, cwd=REPO, stdout=log, stderr=log
        )


def wait_for(check: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def running(side: Side) -> None:
    """Stop the bench when a side's notifier has exited: what it waits for would never come."""
    if side.proc is not None and side.proc.poll() is not None:
        raise SystemExit(f"the {side.name} notifier exited ({side.proc.returncode}); see its log (--keep)")


def logged_in(side: Side) -> bool:
    running(side)
    return "get_me" in side.fake.state()["requests"]


def caught_up(side: Side) -> bool:
    """The notifier's group has read the stream's last entry and acked everything."""
    running(side)
    groups = [g for g in side.client.xinfo_groups(EVENTS_STREAM) if g["name"] == GROUP]
    last = side.client.xrevrange(EVENTS_STREAM, count=1)
    return bool(
        groups and last and groups[0]["pending"] == 0 and groups[0]["last-delivered-id"] == last[0][0]
    )


def inject_429s(fake: FakeDiscord, every: int, retry_after: float) -> None:
    """A 429 on every `every`-th create, edit and thread start, for good."""
    rule = {"kind": "429", "times": ENDLESS, "every": every, "retry_after": retry_after}
    fake.add_faults([{**rule, "op": op} for op in OPS])


def run_sides(sides: list[Side], steps: list[Step], rate: float, work: Path) -> float:
    """Start both notifiers, produce on both sides at once, wait until both have handled everything;
    returns the seconds from the first event produced to the last handled."""
    try:
        for side in sides:
            start_notifier(side, work)
        for side in sides:
            wait_for(partial(logged_in, side), f"{side.name} to log in", 60)
        producers = [threading.Thread(target=produce, args=(side, steps, rate)) for side in sides]
        started = time.monotonic()
        for thread in producers:
            thread.start()
        for thread in producers:
            thread.join()
        for side in sides:
            wait_for(partial(caught_up, side), f"{side.name} to catch up", 600)
        return time.monotonic() - started
    finally:
        for side in sides:
            if side.proc is not None:
                side.proc.send_signal(signal.SIGTERM)
                side.proc.wait(30)


def measure(args: argparse.Namespace, work: Path, redis_url: str) -> tuple[dict[str, SideFigures], float]:
    """Each side's figures, and how long the whole took (seconds)."""
    runs = [run_steps(f"r{i:03d}", fails=i % 4 == 3) for i in range(args.runs)]
    steps = list(interleave(runs, args.width))
    limits = {op: (count, per_s / args.time_scale) for op, (count, per_s) in DISCORD_LIMITS.items()}
    with FakeDiscord(TOKEN, rate_limits=limits) as quiet, FakeDiscord(TOKEN, rate_limits=limits) as noisy:
        for fake in (quiet, noisy):
            fake.add_channel(CHANNEL)  # the notify channel exists (any other is 404 Unknown Channel)
        inject_429s(noisy, args.every, args.retry_after)
        sides = [
            Side("no_injected_429", quiet, redis_url),
            Side("injected_429", noisy, redis_url.replace("?db=0", "?db=1")),
        ]
        try:
            took = run_sides(sides, steps, args.rate, work)
            return {
                s.name: side_figures(s.fake, s.client, CHANNEL, args.retry_after, OPS) for s in sides
            }, took
        finally:
            for side in sides:
                side.client.close()


def report(name: str, side: SideFigures, took: float) -> dict[str, Any]:
    """Print one side's figures; returns them for the JSON."""
    groups = {
        "all_events": side.every,
        "runs_without_429": side.spared,
        "first_events": side.first,
        "pictured": side.pictured,
        "plain": side.plain,
    }
    rows = {group: figures(values) for group, values in groups.items()}
    print(
        f"{name}: {side.runs} runs, {side.runs_met_429} met a 429 ({side.injected_429} injected, "
        f"{side.over_limit_429} over a limit); {side.requests} requests ({side.requests / took:.1f}/s), "
        f"{side.windows_filled} bucket windows used up"
    )
    for group, row in rows.items():
        print(f"  {group:<18} {row}")
    counts = {
        "runs": side.runs,
        "runs_met_429": side.runs_met_429,
        "injected_429": side.injected_429,
        "over_limit_429": side.over_limit_429,
        "windows_filled": side.windows_filled,
        "requests": side.requests,
        "requests_per_s": round(side.requests / took, 2),
    }
    return {**counts, **rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="runs per side (10 or 9 events each)")
    parser.add_argument("--rate", type=float, default=4.0, help="events per second, per side")
    parser.add_argument("--width", type=int, default=10, help="runs under way at once")
    parser.add_argument(
        "--every", type=int, default=20, help="a 429 on every n-th create, edit, thread start"
    )
    parser.add_argument("--retry-after", type=float, default=0.5, help="the injected 429s' Retry-After (s)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="rate-limit windows k times shorter")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (logs)")
    args = parser.parse_args()
    if args.time_scale <= 0:
        parser.error("--time-scale must be positive (1: Discord's own limits)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: still end the notifiers and Redis

    limits = {
        op: f"{count} per {per_s / args.time_scale:g} s per channel"
        for op, (count, per_s) in DISCORD_LIMITS.items()
    }
    scaled = "" if args.time_scale == 1 else f", windows {args.time_scale:g}x shorter than Discord's"
    print(
        f"{args.runs} runs per side at {args.rate:g} events/s, {args.width} at once; a 429 on every "
        f"{args.every}-th request (Retry-After {args.retry_after:g} s) on one side\n"
        f"Discord's limits on both sides{scaled}: {limits}",
        flush=True,
    )
    work = Path(tempfile.mkdtemp(prefix="tf-bench-notify-"))
    try:
        redis_url = ensure_redis(work / "redis-home")
        got, took = measure(args, work, redis_url)
    finally:
        stop_redis(work / "redis-home")
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    sides = {name: report(name, side, took) for name, side in got.items()}
    p99s = [side["runs_without_429"].get("p99_ms", 0.0) for side in sides.values()]
    met = max(p99s) <= GOAL_MS if args.time_scale == 1 else None
    print(f"goal: p99 <= {GOAL_MS:g} ms for events of runs that met no 429, on each side: {met}")
    result = {
        "runs_per_side": args.runs,
        "rate_per_s": args.rate,
        "width": args.width,
        "every": args.every,
        "retry_after_s": args.retry_after,
        "time_scale": args.time_scale,
        "limits": limits,
        "limits_note": "Discord documents 5 per 5 s per channel for messages; thread starts: assumed so",
        "seconds": round(took, 1),
        **sides,
        "goal": f"p99 <= {GOAL_MS:g} ms for events of runs that met no 429, on each side",
        "goal_met": met,
        "leaves_out": "Discord's global limit (50 requests/s per bot), the network, Discord's own time",
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
