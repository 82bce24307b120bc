"""Discord's per-route rate limits, for the fake: so a test can check that a client stays within them.

Discord limits each route per bucket: one bucket hash per route, split by the route's major parameter
(the channel, or the webhook), e.g. 5 messages per 5 s per channel. Every answer on a limited route says
where the bucket stands in `X-RateLimit-Limit / -Remaining / -Reset / -Reset-After / -Bucket`, and a
client that honours them (discord.py's bot HTTP client and its webhook adapters do) waits before it ever
gets a 429. A request over the limit gets Discord's 429 (with `Via`, so discord.py retries it) and is
counted in `over_limit` (and listed in `refused`, with its bucket and when): a client that keeps that at 0
never exceeded the limits. `windows_filled` counts
the windows used up to their limit, which shows that a client did reach the limits (and had to wait).

A window here is fixed: it opens at the first request after the previous one closed and lasts `per_s`,
as Discord's buckets do. Times in headers are rounded up to the millisecond, so a client that waits what
they say never arrives early.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

Limits = dict[str, tuple[int, float]]  # operation -> (requests, per seconds)


@dataclass
class _Window:
    """One bucket's current window: when it opened (monotonic) and how many requests it took."""

    limit: int
    per_s: float
    opened: float = -math.inf
    taken: int = 0

    def left_s(self, now: float) -> float:
        """Seconds until the window closes, rounded up to the millisecond."""
        return max(0.0, math.ceil((self.opened + self.per_s - now) * 1000) / 1000)


@dataclass(frozen=True)
class Refusal:
    """A request over its bucket's limit: its operation, the bucket's major parameter (channel or webhook),
    when (wall clock, as the fake's message times) and the Retry-After it was told."""

    op: str
    major: str
    at: float
    retry_after: float


@dataclass
class Verdict:
    """Whether a request may go through, and the X-RateLimit-* headers its answer carries."""

    allowed: bool
    headers: dict[str, str]
    retry_after: float = 0.0


class RateLimits:
    """Fixed-window limits per (operation, major parameter); operations not in `limits` are unlimited."""

    def __init__(self, limits: Limits | None = None) -> None:
        for op, (count, per_s) in (limits or {}).items():
            if count < 1 or per_s <= 0:
                raise ValueError(f"rate limit of {op!r} must be at least 1 request per a positive time")
        self.limits: Limits = dict(limits or {})
        self.windows: dict[tuple[str, str], _Window] = {}
        self.over_limit = 0
        self.refused: list[Refusal] = []  # each request over a limit
        self.windows_filled = 0  # windows used up to their limit: the client then had to wait
        self.lock = threading.Lock()

    def take(self, op: str, major: str) -> Verdict | None:
        """Count one request on `op` in bucket `major`; None when `op` has no limit."""
        if op not in self.limits:
            return None
        now = time.monotonic()
        with self.lock:
            window = self._window(op, major, now)
            allowed = window.taken < window.limit
            if allowed:
                window.taken += 1
                self.windows_filled += window.taken == window.limit
            left = window.left_s(now)
            if not allowed:
                self.over_limit += 1
                self.refused.append(Refusal(op, major, time.time(), left))
            remaining = window.limit - window.taken
        headers = {
            "X-RateLimit-Limit": str(window.limit),
            "X-RateLimit-Remaining": str(remaining),
            "X-RateLimit-Reset": f"{math.ceil((time.time() + left) * 1000) / 1000:.3f}",
            "X-RateLimit-Reset-After": f"{left:.3f}",
            "X-RateLimit-Bucket": op,  # Discord's is an opaque hash per route; the major parameter splits it
        }
        return Verdict(allowed, headers, retry_after=left)

    def _window(self, op: str, major: str, now: float) -> _Window:
        """The bucket's open window, a fresh one if the last has closed."""
        count, per_s = self.limits[op]
        window = self.windows.setdefault((op, major), _Window(count, per_s))
        if now >= window.opened + window.per_s:
            window.opened, window.taken = now, 0
        return window
