"""bot.lanes: in order per key, keys side by side, a busy lane's items handed over together."""

from __future__ import annotations

import threading
import time

from bot.lanes import Lanes


def test_one_key_in_order_and_batched_while_busy_others_side_by_side() -> None:
    calls: list[tuple[str, list[int]]] = []
    slow_started, release = threading.Event(), threading.Event()

    def handle(key: str, items: list[int]) -> None:
        calls.append((key, items))
        if key == "slow" and items == [1]:
            slow_started.set()
            release.wait(5)

    lanes: Lanes[int] = Lanes(handle, workers=4, name="test")
    lanes.add("slow", 1)
    assert slow_started.wait(5)
    for n in (2, 3, 4):
        lanes.add("slow", n)  # queued behind the busy lane: handed over as one batch
    lanes.add("fast", 10)
    deadline = time.monotonic() + 5
    while ("fast", [10]) not in calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ("fast", [10]) in calls  # not held up by the slow lane
    assert lanes.pending() == 4  # the slow one's first item, and the three behind it
    release.set()
    assert lanes.wait(timeout=5)
    assert [items for key, items in calls if key == "slow"] == [[1], [2, 3, 4]]
    lanes.close()


def test_drop_takes_back_what_is_queued_and_an_exception_drops_only_its_items() -> None:
    busy, release = threading.Event(), threading.Event()
    seen: list[list[str]] = []

    def handle(key: str, items: list[str]) -> None:
        seen.append(items)
        if items == ["a"]:
            busy.set()
            release.wait(5)
        if items == ["boom"]:
            raise RuntimeError("boom")

    lanes: Lanes[str] = Lanes(handle, workers=2, name="test")
    lanes.add("k", "a")
    assert busy.wait(5)
    lanes.add("k", "b")
    lanes.add("k", "c")
    assert lanes.drop("k") == ["b", "c"] and lanes.pending() == 1
    release.set()
    lanes.add("k", "boom")
    assert lanes.wait(timeout=5)
    lanes.add("k", "after")
    assert lanes.wait(timeout=5)
    assert seen == [["a"], ["boom"], ["after"]]  # the lane goes on after an exception
    lanes.close()
