"""Notifier latency, event to Discord, with and without injected 429s, side by side in one run.

Two `fleet notify` processes post as the bot, each into its own fake Discord (tests.fakes.FakeDiscord,
served from this process) and each from its own database of one embedded redis-server. Two producer
threads move the same runs through the real Ledger (tests.factories.Script) at the same steady rate while
the notifiers run, so an event waits only for its notifier. One side's fake answers every `--every`-th
message create, edit and thread start with a 429 (Retry-After `--retry-after` s, with Via, as Discord's),
which discord.py waits out and retries; the other side gets none.

As the bot the notifier gives each run a thread of its own (its own rate-limit buckets, bot.notifier), so
a 429 in one run's thread holds up that run only. On the 429 side, `with_429_after_first` leaves out each
run's first event (it waits on the channel's routes, every run's, for the message its thread starts from
and the thread), and `with_429_other_runs` keeps of those only the runs whose own thread met no 429, and
of their events those written once the run's thread had its first message.

An event's latency runs from its `time` (set as the ledger writes it) to the moment the fake recorded what
it caused: for an event with a message of its own (a result, a failure, a W&B link), that message's
creation; for any other, the first creation or edit of its run's status message after it.

    .venv/bin/python bench/notify.py [--runs 40] [--rate 40] [--every 20] [--retry-after 0.5]

The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import math
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
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import redis

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bot.notifier import PICTURED  # noqa: E402
from bot.render import SEPARATE, separate_message  # noqa: E402
from broker.constants import EVENTS_STREAM  # noqa: E402
from broker.constants import NOTIFIER_GROUP as GROUP  # noqa: E402
from broker.payloads import Event  # noqa: E402
from service.embedded import ensure_redis, stop_redis  # noqa: E402
from tests.factories import Script  # noqa: E402
from tests.fakes import FakeDiscord  # noqa: E402
from tests.fakes.discord import DiscordFault  # noqa: E402
from tests.integration.fleetproc import fleet_env  # noqa: E402

TOKEN = "bench-bot-token"
KINDS = ("pictured", "plain")  # results and failures (with the loss picture), and every other event
CHANNEL = 423456789012345678
OPS = ("create_message", "edit_message", "start_thread")  # every request a run makes
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


def logged_in(side: Side) -> bool:
    return "get_me" in side.fake.state()["requests"]


def caught_up(side: Side) -> bool:
    """The notifier's group has read the stream's last entry and acked everything."""
    groups = [g for g in side.client.xinfo_groups(EVENTS_STREAM) if g["name"] == GROUP]
    last = side.client.xrevrange(EVENTS_STREAM, count=1)
    return bool(
        groups and last and groups[0]["pending"] == 0 and groups[0]["last-delivered-id"] == last[0][0]
    )


def _at(version: dict[str, Any]) -> float:
    return datetime.fromisoformat(version["at"]).timestamp()


def latencies(side: Side) -> dict[str, list[float]]:
    """Seconds from each run event to what it caused on the fake Discord (see the module docstring): all
    events (`every`); all but each run's first (`later`: the first waits on the channel's routes, every
    run's, for its thread); of those, the ones of runs whose own thread met no 429, written once the run's
    thread had its first message (`spared`: before that, an event waits behind its run's first, which may
    wait on the channel's routes); the results and failures, whose messages carry the run's loss picture
    (`pictured`), and all the others (`plain`)."""
    state = side.fake.state()
    own = [t for t, thread in state["threads"].items() if thread["parent_id"] == str(CHANNEL)]
    messages = [m for channel in (str(CHANNEL), *own) for m in state["channels"].get(channel, [])]
    hit = {f["channel"] for f in state["faults_served"]}
    hit_runs = {state["threads"][t]["name"].split(" · ")[0] for t in own if t in hit}
    ready = {
        state["threads"][t]["name"].split(" · ")[0]: min(_at(m["created"]) for m in state["channels"][t])
        for t in own
        if state["channels"].get(t)
    }
    posted = {m["created"]["content"]: _at(m["created"]) for m in messages if m["created"]["content"]}
    status: dict[str, list[float]] = {}
    for m in messages:
        if m["embeds"]:
            run_id = m["embeds"][0]["title"].split(" · ")[0]
            status.setdefault(run_id, []).extend(_at(v) for v in [m["created"], *m["edits"]])
    found: dict[str, list[float]] = {k: [] for k in ("every", "later", "spared", "pictured", "plain")}
    seen = set()
    for _sid, fields in side.client.xrange(EVENTS_STREAM):
        event = Event.model_validate_json(fields["event"])
        text = separate_message(event) if event.type in SEPARATE else None
        if text is not None:
            took = posted[text] - event.time
        elif event.run_id is not None:
            took = min(t for t in status[event.run_id] if t >= event.time) - event.time
        else:
            continue
        found["every"].append(took)
        found["pictured" if event.type in PICTURED else "plain"].append(took)
        if event.run_id in seen:
            found["later"].append(took)
            if event.run_id not in hit_runs and event.time >= ready.get(event.run_id or "", math.inf):
                found["spared"].append(took)
        seen.add(event.run_id)
    return found


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def figures(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {
        "p50_ms": round(percentile(ms, 50), 1),
        "p99_ms": round(percentile(ms, 99), 1),
        "max_ms": round(max(ms), 1),
    }


def inject_429s(fake: FakeDiscord, every: int, retry_after: float) -> list[DiscordFault]:
    """A 429 on every `every`-th create and edit, for good; returns the rules (each counts its answers)."""
    rule = {"kind": "429", "times": ENDLESS, "every": every, "retry_after": retry_after}
    fake.add_faults([{**rule, "op": op} for op in OPS])
    return list(fake.faults)


def run_sides(sides: list[Side], steps: list[Step], rate: float, work: Path) -> None:
    """Start both notifiers, produce on both sides at once, wait until both have handled everything."""
    try:
        for side in sides:
            start_notifier(side, work)
        for side in sides:
            wait_for(partial(logged_in, side), f"{side.name} to log in", 60)
        producers = [threading.Thread(target=produce, args=(side, steps, rate)) for side in sides]
        for thread in producers:
            thread.start()
        for thread in producers:
            thread.join()
        for side in sides:
            wait_for(partial(caught_up, side), f"{side.name} to catch up", 120)
    finally:
        for side in sides:
            if side.proc is not None:
                side.proc.send_signal(signal.SIGTERM)
                side.proc.wait(30)


def measure(args: argparse.Namespace, work: Path, redis_url: str) -> dict[str, Any]:
    """Latencies and request counts per side, and how many 429s were injected."""
    runs = [run_steps(f"r{i:03d}", fails=i % 4 == 3) for i in range(args.runs)]
    steps = list(interleave(runs, args.width))
    with FakeDiscord(token=TOKEN) as quiet, FakeDiscord(token=TOKEN) as noisy:
        rules = inject_429s(noisy, args.every, args.retry_after)
        sides = [
            Side("no_429", quiet, redis_url),
            Side("with_429", noisy, redis_url.replace("?db=0", "?db=1")),
        ]
        try:
            run_sides(sides, steps, args.rate, work)
            result = {side.name: latencies(side) for side in sides}
        finally:
            for side in sides:
                side.client.close()
        counts = {side.name: sum(side.fake.state()["requests"].get(op, 0) for op in OPS) for side in sides}
    return {
        "latencies": {name: found["every"] for name, found in result.items()},
        "later": result["with_429"]["later"],
        "spared": result["with_429"]["spared"],
        "by_kind": {f"{name}_{kind}": found[kind] for name, found in result.items() for kind in KINDS},
        "requests": counts,
        "injected": sum(ENDLESS - r.times for r in rules),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="runs per side (10 or 9 events each)")
    parser.add_argument("--rate", type=float, default=40.0, help="events per second, per side")
    parser.add_argument("--width", type=int, default=10, help="runs under way at once")
    parser.add_argument("--every", type=int, default=20, help="a 429 on every n-th create and edit")
    parser.add_argument("--retry-after", type=float, default=0.5, help="the 429s' Retry-After (s)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (logs)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tf-bench-notify-"))
    try:
        redis_url = ensure_redis(work / "redis-home")
        print(
            f"{args.runs} runs per side at {args.rate:g} events/s; a 429 on every {args.every}-th request "
            f"(Retry-After {args.retry_after:g} s) on one side",
            flush=True,
        )
        got = measure(args, work, redis_url)
    finally:
        stop_redis(work / "redis-home")
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    table = {name: figures(values) for name, values in got["latencies"].items()}
    print(f"{'':<10} {'events':>7} {'requests':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name, row in table.items():
        count, requests = len(got["latencies"][name]), got["requests"][name]
        print(f"{name:<10} {count:>7} {requests:>9} {row['p50_ms']:>8} {row['p99_ms']:>8} {row['max_ms']:>8}")
    spared = figures(got["spared"]) if got["spared"] else {}
    later = figures(got["later"]) if got["later"] else {}
    by_kind = {name: figures(values) for name, values in got["by_kind"].items() if values}
    for name, row in by_kind.items():
        print(f"{name}: {row}")
    print(f"429s injected on the with_429 side: {got['injected']}")
    print(f"with_429, all but each run's first event ({len(got['later'])} events): {later}")
    print(f"... of runs whose own thread met no 429 ({len(got['spared'])} events): {spared}")
    result = {
        "events": len(got["latencies"]["no_429"]),
        "rate_per_s": args.rate,
        "runs": args.runs,
        "width": args.width,
        **table,
        "with_429_after_first": later,
        "with_429_other_runs": spared,
        **by_kind,
        "injected_429": got["injected"],
        "retry_after_s": args.retry_after,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
