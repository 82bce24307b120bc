"""Lanes: work in order per key, different keys side by side, on one pool of threads.

The notifier gives each run a lane: its events are handled one batch at a time, in the order they came,
while other runs' lanes go on beside it. A lane that waits (a 429's Retry-After on its run's route) holds
up only itself. Items that come for a busy lane queue behind it and are handed over together, as one
batch, when it is free: a run with ten new events costs one status edit, not ten.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class Lanes(Generic[T]):
    """`handle(key, items)` runs for each key's queued items, one call at a time per key, at most `workers`
    calls at once. It must not raise (an exception is logged and its items dropped)."""

    def __init__(self, handle: Callable[[str, list[T]], None], workers: int, name: str) -> None:
        self._handle = handle
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=name)
        self._queued: dict[str, list[T]] = {}
        self._busy: set[str] = set()
        self._count = 0  # items queued or being handled
        self._changed = threading.Condition()

    def add(self, key: str, item: T) -> None:
        """Queue `item` in `key`'s lane; its lane starts when it is not running already."""
        with self._changed:
            self._queued.setdefault(key, []).append(item)
            self._count += 1
            if key in self._busy:
                return
            self._busy.add(key)
        self._pool.submit(self._run, key)

    def drop(self, key: str) -> list[T]:
        """Take back what is queued in `key`'s lane and not handed over yet."""
        with self._changed:
            items = self._queued.pop(key, [])
            self._count -= len(items)
            self._changed.notify_all()
        return items

    def pending(self) -> int:
        """Items queued or being handled."""
        with self._changed:
            return self._count

    def wait(self, below: int = 1, timeout: float | None = None) -> bool:
        """Wait until fewer than `below` items are queued or being handled (1: every lane idle)."""
        with self._changed:
            return self._changed.wait_for(lambda: self._count < below, timeout)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self, key: str) -> None:
        while True:
            with self._changed:
                items = self._queued.pop(key, [])
                if not items:
                    self._busy.discard(key)
                    self._changed.notify_all()
                    return
            try:
                self._handle(key, items)
            except Exception:
                log.exception("lane %s: %d items dropped", key, len(items))
            finally:
                with self._changed:
                    self._count -= len(items)
                    self._changed.notify_all()
