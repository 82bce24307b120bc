"""One fault case: what it injected, which runs it expects to end and how, and where the shared checker
(tests.faults.invariants) must look afterwards.

A test gets a `Case` from the `case` fixture, registers what it sets up (`watch_cloud`, `watch_home`,
`watch_redis`, `watch_log`, `watch_discord`), counts each fault it applies (`inject`), names each run's
expected end (`expect`), and ends with `case.check()`. What it starts goes on `case.stack`, which is
closed only after the check (the checker still needs the fakes and the fleet). The fixture runs the check
anyway when a test did not get that far, and hands the record to the session's collector
(tests.faults.collector).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis

from state.stages import RunState
from tests.fakes import FakeCloud, FakeDiscord
from tests.faults.canaries import CANARIES

Reaper = Callable[[], object]
F = TypeVar("F", bound=FakeCloud)
CLOUD_KEYS = {"runpod": "RUNPOD_API_KEY", "vastai": "VAST_API_KEY"}


@dataclass
class Findings:
    """What the invariants found; every list must be empty."""

    duplicates: list[str] = field(default_factory=list)  # I1: names with more than one live instance
    leaked: list[str] = field(default_factory=list)  # I2: instances alive after the end + a reap cycle
    not_terminal: list[str] = field(default_factory=list)  # I3: runs that never ended
    secret_hits: list[str] = field(default_factory=list)  # I4: where a canary secret showed up
    wrong_end: list[str] = field(default_factory=list)  # runs that ended, but not as the case expected

    def clean(self) -> bool:
        return not (self.duplicates or self.leaked or self.not_terminal or self.secret_hits or self.wrong_end)

    def as_dict(self) -> dict[str, list[str]]:
        return {
            "duplicates": self.duplicates,
            "leaked": self.leaked,
            "not_terminal": self.not_terminal,
            "secret_hits": self.secret_hits,
            "wrong_end": self.wrong_end,
        }


class HeadSampler:
    """Samples the local Ray heads under a fleet home in a thread: per instance name, the most `ray start
    --head` processes seen at once (two heads of one name share its temp dir, so both are counted)."""

    def __init__(self, home: Path, every_s: float = 0.5) -> None:
        self.home, self.every_s = home, every_s
        self.most: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="head-sampler", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        from tests.faults.invariants import heads_per_name

        while not self._stop.wait(self.every_s):
            for name, count in heads_per_name(self.home).items():
                self.most[name] = max(self.most.get(name, 0), count)

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join(10)
        return dict(self.most)


@dataclass
class Case:
    """The record of one fault case."""

    name: str
    injected: Counter[str] = field(default_factory=Counter)
    expected: dict[str, RunState] = field(default_factory=dict)
    ended: dict[str, str] = field(default_factory=dict)
    clouds: list[FakeCloud] = field(default_factory=list)
    homes: list[Path] = field(default_factory=list)
    redis_urls: list[Callable[[], str]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    discords: list[FakeDiscord] = field(default_factory=list)
    published: list[Path] = field(default_factory=list)
    samplers: list[HeadSampler] = field(default_factory=list)
    reaper: Reaper | None = None
    end_timeout_s: float = 300.0
    settle_s: float = 30.0
    secrets: dict[str, str] = field(default_factory=lambda: dict(CANARIES))
    findings: Findings | None = None
    started: float = field(default_factory=time.monotonic)
    notes: dict[str, Any] = field(default_factory=dict)
    # What the case started (fakes, fleets): closed after the check, in reverse order.
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    # -- what the case sets up ---------------------------------------------------------------------
    def cloud(self, kind: type[F], home: Path, **options: Any) -> F:
        """Start a fake cloud for this case (its canary key, stopped after the check) and watch it."""
        fake = kind(api_key=CANARIES[CLOUD_KEYS[kind.vendor]], home=home, **options)
        return self.watch_cloud(self.stack.enter_context(fake))

    def watch_cloud(self, fake: F) -> F:
        """A fake cloud: its live instances (I2), its most-live per name (I1), its served faults."""
        if fake not in self.clouds:
            self.clouds.append(fake)
        return fake

    def watch_home(self, home: Path) -> None:
        """A fleet home whose local Ray heads are instances (I1 by sampling, I2) and whose files are
        scanned for secrets (I4)."""
        self.homes.append(home)
        self.samplers.append(HeadSampler(home))

    def watch_redis(self, url: Callable[[], str]) -> None:
        """A Redis (read through `url()` each time: it may move) holding runs (I3) and scanned (I4)."""
        self.redis_urls.append(url)

    def watch_log(self, path: Path) -> None:
        """A process's log, scanned for secrets (I4) and for crash points hit."""
        self.logs.append(path)

    def watch_published(self, folder: Path) -> None:
        """Files the fleet published (a fake Hub's store): scanned for secrets (I4)."""
        self.published.append(folder)

    def watch_discord(self, fake: FakeDiscord) -> None:
        """A fake Discord the events are posted to: its messages are scanned for secrets (I4)."""
        self.discords.append(fake)

    # -- what the case did and expects -------------------------------------------------------------
    def inject(self, kind: str, count: int = 1) -> None:
        """Count a fault the test applied itself (a kill, a Redis restart)."""
        self.injected[kind] += count

    def expect(self, run_id: str, state: RunState) -> None:
        """The run must end, and end in `state`."""
        self.expected[run_id] = state

    def clients(self) -> list[redis.Redis[str]]:
        return [redis.Redis.from_url(url(), decode_responses=True) for url in self.redis_urls]

    def check(self) -> Findings:
        """Run the shared invariant checker (once) and fail the test on any finding."""
        from tests.faults.invariants import check

        if self.findings is None:
            self.findings = check(self)
        assert self.findings.clean(), f"{self.name}: {self.findings.as_dict()}"
        return self.findings

    def record(self, passed: bool, known_broken: str | None = None) -> dict[str, Any]:
        """The case as the collector writes it; `known_broken` is the reason of a strict xfail (a product
        bug the case shows), which keeps the case out of the totals."""
        findings = self.findings or Findings()
        return {
            "case": self.name,
            "passed": passed and findings.clean(),
            "known_broken": known_broken,
            "seconds": round(time.monotonic() - self.started, 1),
            "injected": dict(sorted(self.injected.items())),
            "faults_injected": sum(self.injected.values()),
            "runs": {run_id: self.ended.get(run_id, "?") for run_id in self.expected},
            "expected": {run_id: state.value for run_id, state in self.expected.items()},
            "findings": findings.as_dict(),
            "notes": self.notes,
        }
