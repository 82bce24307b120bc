"""providers.listing: a provider's instance list shared by the fleet's processes for a moment, in the real
Redis. Several processes' looks within max_age_s cost one vendor call; a change the fleet makes, or a
fresh look, asks the vendor again; a process that claimed the refresh and died blocks nobody for long."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
import redis
from pydantic import BaseModel, ConfigDict

from providers.listing import ListingCache, RedisListings, SharedListing


class Row(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: int
    name: str


class Vendor:
    """The vendor's list call, counted; slow like a real one."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.calls, self.delay_s, self.rows = 0, delay_s, [Row(id=1, name="tf-a-1")]
        self._lock = threading.Lock()

    def __call__(self) -> list[Row]:
        with self._lock:
            self.calls += 1
        time.sleep(self.delay_s)
        return list(self.rows)


def listing(
    client: redis.Redis[str], account: str = "url|key", max_age_s: float = 5.0, changed_age_s: float = 0.1
) -> SharedListing[Row]:
    cache = ListingCache(
        RedisListings(client), max_age_s=max_age_s, wait_s=1.0, changed_age_s=changed_age_s, spacing_s=0.5
    )
    return SharedListing(cache, "runpod", account, Row)


def test_every_processs_looks_within_the_max_age_cost_one_vendor_call(redis_client: redis.Redis[str]) -> None:
    vendor = Vendor()
    first, second = listing(redis_client), listing(redis_client)  # two worker processes
    for _ in range(5):
        assert first.records(vendor) == [Row(id=1, name="tf-a-1")]
        assert second.records(vendor) == [Row(id=1, name="tf-a-1")]
    assert vendor.calls == 1
    # Another account (another API key or URL) has a list of its own.
    assert listing(redis_client, account="url|other").records(vendor) and vendor.calls == 2
    # The key names the provider, never the credential.
    assert "key" not in first.key and first.key.startswith("tf:listing:runpod:")


def test_a_change_or_a_fresh_look_asks_the_vendor_and_an_old_list_expires(
    redis_client: redis.Redis[str],
) -> None:
    vendor = Vendor()
    shared = listing(redis_client, max_age_s=0.3, changed_age_s=0.1)
    shared.records(vendor)
    vendor.rows.append(Row(id=2, name="tf-b-1"))  # the fleet created one
    shared.changed()  # the kept list lives at most changed_age_s (0.1 s here) more
    other = listing(redis_client, max_age_s=0.3, changed_age_s=0.1)
    assert [r.id for r in other.records(vendor)] == [1] and vendor.calls == 1  # a moment behind...
    time.sleep(0.15)
    # Out of date now, but the vendor was asked less than spacing_s (0.5 s) ago: the kept list serves,
    # without a wait, rather than a second call so soon...
    assert [r.id for r in other.records(vendor)] == [1] and vendor.calls == 1
    time.sleep(0.4)
    assert [r.id for r in other.records(vendor)] == [1, 2]  # ...then the vendor's again
    assert vendor.calls == 2
    started = time.monotonic()
    assert len(shared.records(vendor, fresh=True)) == 2 and vendor.calls == 3  # fresh: waits its turn
    assert time.monotonic() - started > 0.4
    time.sleep(0.6)
    shared.records(vendor)  # older than max_age_s (0.3 s here): asked again
    assert vendor.calls == 4


def test_concurrent_misses_wait_for_the_one_refresh(redis_client: redis.Redis[str]) -> None:
    vendor = Vendor(delay_s=0.3)
    found: list[int] = []

    def look() -> None:
        found.append(len(listing(redis_client).records(vendor)))

    threads = [threading.Thread(target=look) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert found == [1] * 6 and vendor.calls == 1


def test_a_burst_of_fresh_looks_is_served_by_one_or_two_calls_each_as_of_its_look(
    redis_client: redis.Redis[str],
) -> None:
    vendor = Vendor(delay_s=0.05)
    listing(redis_client).records(vendor)  # a list is kept...
    vendor.rows.append(Row(id=2, name="tf-b-1"))  # ...and then the account changed
    seen: list[int] = []

    def look() -> None:  # 20 terminates in a burst, each asking whether its instance is gone
        seen.append(len(listing(redis_client).records(vendor, fresh=True)))

    threads = [threading.Thread(target=look) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == [2] * 20  # never the list kept from before the look
    assert vendor.calls <= 3, vendor.calls  # 1 before + one or two for the burst, not twenty


def test_the_vendor_is_asked_at_most_once_per_spacing_whatever_the_lookers(
    redis_client: redis.Redis[str],
) -> None:
    vendor = Vendor()
    cache = ListingCache(RedisListings(redis_client), max_age_s=0.01, wait_s=2.0, spacing_s=0.5)
    began = time.monotonic()
    stop = began + 2.0
    calls_at: list[float] = []

    def ask() -> list[Row]:
        calls_at.append(time.monotonic() - began)
        return vendor()

    def look() -> None:  # the list is kept a moment only; half the looks must see the vendor's own
        shared = SharedListing(cache, "runpod", "url|key", Row)
        n = 0
        while time.monotonic() < stop:
            shared.records(ask, fresh=n % 2 == 0)
            n += 1

    threads = [threading.Thread(target=look) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    calls_at.sort()
    assert len([t for t in calls_at if t < 2.0]) <= 4, calls_at  # at most one call per 0.5 s
    assert all(b - a > 0.45 for a, b in itertools.pairwise(calls_at)), calls_at


def paged(shared: SharedListing[Row], rows: int, page: int, began: float, starts: list[float]) -> list[Row]:
    """A vendor's paged list, as providers.vastai.client asks it: a request per `page` rows, `pace()`
    between two; each request's start is noted (seconds since `began`)."""
    found: list[Row] = []
    for first in range(0, rows, page):
        if first:
            shared.pace()
        starts.append(time.monotonic() - began)
        time.sleep(0.02)  # the request itself
        found += [Row(id=i, name=f"tf-{i}-1") for i in range(first, min(rows, first + page))]
    return found


def test_a_paged_lists_requests_are_spaced_like_lists(redis_client: redis.Redis[str]) -> None:
    cache = ListingCache(RedisListings(redis_client), max_age_s=0.01, wait_s=3.0, spacing_s=0.2)
    shared = SharedListing(cache, "vastai", "url|key", Row)
    began, starts = time.monotonic(), list[float]()
    assert len(shared.records(lambda: paged(shared, 5, 2, began, starts))) == 5  # 3 requests
    assert len(shared.records(lambda: paged(shared, 5, 2, began, starts), fresh=True)) == 5  # 3 more
    assert len(starts) == 6 and all(b - a > 0.18 for a, b in itertools.pairwise(starts)), starts


def test_lookers_wait_out_a_paged_list_longer_than_the_wait_without_asking_beside_it(
    redis_client: redis.Redis[str],
) -> None:
    # 5 pages spaced 0.3 s take 1.2 s, more than wait_s: the claimant shows it is alive at each page, so
    # the fresh lookers meanwhile wait for it instead of asking the vendor too.
    cache = ListingCache(RedisListings(redis_client), max_age_s=0.01, wait_s=0.5, spacing_s=0.3)
    began, starts = time.monotonic(), list[float]()

    def look() -> None:
        shared = SharedListing(cache, "vastai", "url|key", Row)
        assert len(shared.records(lambda: paged(shared, 10, 2, began, starts), fresh=True)) == 10

    threads = [threading.Thread(target=look) for _ in range(4)]
    for thread in threads:
        thread.start()
        time.sleep(0.1)
    for thread in threads:
        thread.join()
    starts.sort()
    assert len(starts) >= 10 and all(b - a > 0.27 for a, b in itertools.pairwise(starts)), [
        round(t, 3) for t in starts
    ]


def test_a_dead_claimant_delays_a_look_by_at_most_the_wait(redis_client: redis.Redis[str]) -> None:
    vendor = Vendor()
    shared = listing(redis_client)
    assert RedisListings(redis_client).claim(shared.key, 30.0)  # a process claimed the refresh and died
    started = time.monotonic()
    assert shared.records(vendor) and vendor.calls == 1
    assert 0.9 < time.monotonic() - started < 3.0  # wait_s = 1: then it asked the vendor itself


def test_a_failed_vendor_call_holds_the_next_look_back_by_the_spacing_only(
    redis_client: redis.Redis[str],
) -> None:
    cache = ListingCache(RedisListings(redis_client), max_age_s=5.0, wait_s=3.0, spacing_s=0.2)
    calls: list[float] = []

    def failing() -> list[Row]:
        calls.append(time.monotonic())
        raise ConnectionError("vendor down")

    for _ in range(2):  # two processes in turn, the vendor failing each
        with pytest.raises(ConnectionError):
            SharedListing(cache, "runpod", "url|key", Row).records(failing)
    assert len(calls) == 2 and 0.18 < calls[1] - calls[0] < 1.0  # not the claim's 3 s


def test_without_a_cache_every_look_asks_the_vendor() -> None:
    vendor = Vendor()
    shared = SharedListing(None, "runpod", "url|key", Row)
    shared.records(vendor)
    shared.records(vendor)
    assert vendor.calls == 2
