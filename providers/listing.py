"""A cloud's list of instances, shared by every process of the fleet for a moment.

Every look at a rented node (is it up, where is its head, is it still there) reads the vendor's whole
instance list: RunPod and vast.ai have no cheap "get one by name". One list call per look made the
provider calls grow with runs x ticks (a tiny run: 71 list calls; 200 runs: 200 a second, far past the
vendors' rate limits). So the list is kept in Redis for `max_age_s` (the settings' provider_list_max_age_s,
1 s by default) under a key of the provider's account, and every look in that time, from any worker
process, reads it there: one vendor call per provider per moment, whatever the number of runs.

Only one process asks the vendor at a time, and not more often than every `spacing_s` (0.6 s):
the first to miss claims the refresh (SET NX), and the claim outlives the call until `spacing_s` after it
began. A paged list (vast.ai's) is one request per page: the provider calls `pace` between them, which
spaces them too and holds the claim. Meanwhile a look is served the list kept a moment ago (kept
`STALE_S` past its age for that), never made to wait; only a look with no list kept, or one that must
see the vendor's list as of now (`fresh`: after a destroy, the reaper's pass), waits for the next one,
until the claimant has not shown it is alive for `wait_s` (then it asks itself: the claimant died or is
slow, and a crash never blocks a look). A burst of fresh looks is so served by one or two calls, not one
each. A change the fleet makes (a create, a destroy) makes the kept list old half a second later, so a
look soon after sees it. A list may so be a moment behind the vendor's: the stages already allow for that
(providers' lists lag too: several looks in a row before a node is called lost). So the vendor sees at
most 1/spacing_s list requests a second per account from the whole fleet, whatever the number of runs
and however many pages the list has.

Within one process the parsed records are kept with the text they came from: 200 runs reading one list
parse it once, not 200 times.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import redis
from pydantic import BaseModel, TypeAdapter

from state.keys import listing_key

WAIT_POLL_S = 0.05
STALE_S = 10.0  # an old list is still kept this long: served while the next is being asked (not waited on)
R = TypeVar("R", bound=BaseModel)


@dataclass(frozen=True)
class RedisListings:
    """Where the lists are kept: the fleet's Redis."""

    client: redis.Redis[str]

    def get(self, key: str) -> tuple[str | None, float, float]:
        """The kept list (None: none), when the fleet last changed the account (0: not lately), and when the
        process asking the vendor now last showed it is alive (0: none is)."""
        value, changed, claim = self.client.mget([key, key + ":changed", key + ":claim"])
        return value, float(changed or 0), float(claim or 0)

    def put(self, key: str, value: str, ttl_s: float, claim_left_s: float) -> None:
        """Keep `value` for `ttl_s`; the refresh's claim lasts `claim_left_s` more (the spacing of calls)."""
        pipe = self.client.pipeline()
        pipe.set(key, value, px=_ms(ttl_s))
        self._release(pipe, key, claim_left_s)
        pipe.execute()

    def release(self, key: str, claim_left_s: float) -> None:
        """The refresh failed: its claim lasts `claim_left_s` more (the spacing), not its whole ttl."""
        pipe = self.client.pipeline()
        self._release(pipe, key, claim_left_s)
        pipe.execute()

    @staticmethod
    def _release(pipe: redis.client.Pipeline[str], key: str, claim_left_s: float) -> None:
        if claim_left_s > 0:
            pipe.pexpire(key + ":claim", _ms(claim_left_s))
        else:
            pipe.delete(key + ":claim")

    def claim(self, key: str, ttl_s: float) -> bool:
        """True for the one caller that may refresh `key` now (until `ttl_s` passes, or its `put`)."""
        return bool(self.client.set(key + ":claim", repr(time.time()), nx=True, px=_ms(ttl_s)))

    def hold(self, key: str, ttl_s: float) -> None:
        """The claimant is alive and still asking (a paged list): its claim lasts `ttl_s` from now."""
        self.client.set(key + ":claim", repr(time.time()), xx=True, px=_ms(ttl_s))

    def changed(self, key: str, ttl_s: float) -> None:
        """Note that the account changed now (kept for `ttl_s`)."""
        self.client.set(key + ":changed", repr(time.time()), px=_ms(ttl_s))


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


@dataclass(frozen=True)
class ListingCache:
    """What a provider is given to share its lists: the store, how old a list may be, how long to wait for
    another process's refresh."""

    store: RedisListings
    max_age_s: float = 1.0
    wait_s: float = 2.0
    changed_age_s: float = 0.5
    """How old a list may still be once the fleet changed the account (a create, a destroy)."""
    spacing_s: float = 0.6
    """The least time between two of the fleet's list requests to one account (from their starts): at most
    two in any second at the vendor, with room for a request that reaches it a little late (0.5 s would
    let three fall within one second there, bench/scale.py saw it)."""


@dataclass
class SharedListing(Generic[R]):
    """One provider account's instance list through a ListingCache (None: every look asks the vendor)."""

    cache: ListingCache | None
    provider: str
    account: str
    """What tells the provider's accounts apart (its API URL and key), hashed into the key."""
    model: type[R]
    _parsed: tuple[str, list[R]] | None = field(default=None, repr=False)
    _asked_at: float = field(default=0.0, repr=False)  # when this process's last request to the vendor began
    _adapter: TypeAdapter[list[R]] = field(init=False, repr=False)
    key: str = field(init=False)
    """Where the list is kept (state.keys.listing_key), the account hashed into it."""

    def __post_init__(self) -> None:
        self._adapter = TypeAdapter(list[self.model])  # type: ignore[name-defined]
        self.key = listing_key(self.provider, hashlib.sha256(self.account.encode()).hexdigest()[:16])

    def records(self, ask: Callable[[], Sequence[R]], fresh: bool = False) -> list[R]:
        """The account's records: the kept list when one is young enough (`fresh`: one asked of the vendor
        after this call began), else `ask()`'s (the vendor's call, made by one caller at a time, spaced),
        which is then kept for the others."""
        if self.cache is None:
            return list(ask())
        store, key, cache = self.cache.store, self.key, self.cache
        since = time.time() if fresh else 0.0
        alive_at = time.time()  # when the one asking the vendor last showed it is alive, as far as known here
        while True:
            kept, changed_at, claimed_at = store.get(key)
            if kept is not None:
                at, _, text = kept.partition("\n")
                if float(at) >= since if fresh else self._young(float(at), changed_at):
                    return self._parse(text)
            if store.claim(key, cache.wait_s):
                break  # ours to ask
            alive_at = max(alive_at, claimed_at) if claimed_at else time.time()  # none read: one just claimed
            if time.time() >= alive_at + cache.wait_s:
                break  # the one asking died or is slow: ask too, rather than wait on
            if kept is not None and not fresh:
                return self._parse(text)  # being asked (or not yet again): the kept one, a moment older
            time.sleep(WAIT_POLL_S)
        began = time.time()
        self._asked_at = time.monotonic()
        try:
            found = list(ask())
        except BaseException:  # the next may ask once the spacing is over, not wait for this claim's end
            store.release(key, cache.spacing_s - (time.monotonic() - self._asked_at))
            raise
        text = self._adapter.dump_json(found, by_alias=True).decode()
        kept_s = cache.max_age_s + STALE_S  # young for max_age_s, then stale (and long enough for waiters)
        left_s = cache.spacing_s - (time.monotonic() - self._asked_at)  # after the last request (page) began
        store.put(key, f"{began!r}\n{text}", kept_s, left_s)
        self._parsed = (text, found)
        return found

    def pace(self) -> None:
        """Between two requests of one paged list (the provider calls it): wait until `spacing_s` after the
        last began, and hold the claim meanwhile (the lookers waiting on this list see it is under way)."""
        if self.cache is None:
            return
        time.sleep(max(0.0, self._asked_at + self.cache.spacing_s - time.monotonic()))
        self._asked_at = time.monotonic()
        self.cache.store.hold(self.key, self.cache.wait_s)

    def changed(self) -> None:
        """The fleet changed the account's instances (a create, a destroy): the kept list is out of date,
        and young at most `changed_age_s` more. Not at once: 200 creates in a burst then cost two vendor
        lists a second, not 200; the stages allow for a list a moment behind (a node is lost only after
        several looks in a row without it)."""
        if self.cache is not None:
            self.cache.store.changed(self.key, self.cache.max_age_s + STALE_S)

    def _young(self, at: float, changed_at: float) -> bool:
        """Whether a list asked at `at` still serves a look that need not be fresh."""
        assert self.cache is not None
        now = time.time()
        if changed_at > at and now > changed_at + min(self.cache.changed_age_s, self.cache.max_age_s):
            return False  # the fleet changed the account after it was asked, a while ago
        return now - at <= self.cache.max_age_s

    def _parse(self, text: str) -> list[R]:
        if self._parsed is None or self._parsed[0] != text:
            self._parsed = (text, self._adapter.validate_json(text))
        return list(self._parsed[1])
