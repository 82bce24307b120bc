"""bench/scale.py's sampler: every `interval_s`, what each fake cloud has served (its request counters and
live instances, from `GET /_fake/state`), the fleet processes' RSS, and the Celery queues' backlog in
Redis. The Redis commands the bench itself sends are counted (`own`), so they can be taken out of the
fleet's."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis

from bench.scale_procs import Proc, rss

QUEUES = ("provision", "prepare", "train", "finalize", "reap")
UNACKED = "unacked"  # kombu's hash of the messages its consumers hold (reserved, ETA ones too)


def fake_state(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/_fake/state", timeout=30) as reply:
        state: dict[str, Any] = json.loads(reply.read())
    return state


@dataclass
class Sample:
    """One look at the fleet and the fakes."""

    at: float
    requests: dict[str, dict[str, int]]  # vendor -> op -> requests so far
    live: dict[str, int]  # vendor -> live instances
    rss_total: int
    rss_max: int
    processes: int
    queued: dict[str, int]  # queue -> messages waiting in its list
    unacked: int


@dataclass
class Sampler:
    """Samples in a daemon thread until `stop`; `samples` in order."""

    client: redis.Redis[str]
    fakes: dict[str, str]  # vendor -> URL
    procs: list[Proc]
    interval_s: float = 0.5
    samples: list[Sample] = field(default_factory=list)
    own: Counter[str] = field(default_factory=Counter)  # Redis commands this bench sent, by name
    errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, command: str, times: int = 1) -> None:
        """Note `times` Redis commands named `command` that the bench sent (not the fleet)."""
        with self._lock:
            self.own[command.lower()] += times

    def take(self) -> Sample:
        """One sample, now."""
        states = {vendor: fake_state(url) for vendor, url in self.fakes.items()}
        total, largest, count = rss(self.procs)
        with self.client.pipeline(transaction=False) as pipe:
            for queue in QUEUES:
                pipe.llen(queue)
            pipe.hlen(UNACKED)
            *lengths, unacked = pipe.execute()
        self.count("llen", len(QUEUES))
        self.count("hlen")
        return Sample(
            at=time.time(),
            requests={v: dict(s["requests"]) for v, s in states.items()},
            live={v: len(s["instances"]) for v, s in states.items()},
            rss_total=total,
            rss_max=largest,
            processes=count,
            queued=dict(zip(QUEUES, map(int, lengths), strict=True)),
            unacked=int(unacked),
        )

    def start(self) -> None:
        self.samples.append(self.take())
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_at = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += self.interval_s
            try:
                self.samples.append(self.take())
            except (OSError, redis.RedisError, ValueError):
                self.errors += 1  # a fake or Redis too busy to answer in time: a gap in the samples

    def stop(self) -> None:
        """Stop sampling and take a last sample."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        self.samples.append(self.take())
