"""Locks in Redis held under a token of the holder's own: only the holder renews or releases its lock, so
a holder whose lock expired never deletes the next holder's. A lease can renew itself while its work runs
(every third of its TTL, from a daemon thread), so work that takes longer than the TTL (a reaper pass whose
provider call hangs until its timeout) keeps the lock; a holder that dies stops renewing, and its lock
expires one TTL later. `Renewer` is that thread on its own: a run's claim (broker.dispatch) uses it too."""

from __future__ import annotations

import threading
import time
import uuid

import redis

# KEYS[1] the lock; ARGV[1] the holder's token (and ARGV[2] a TTL in ms): only the holder's own lock.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""


class Renewer:
    """Renews `key`'s TTL every third of it while the key still holds `token` (compare-and-pexpire, one
    Lua script); stops for good at `stop()` or once the key holds another value or none (taken over,
    handed on, expired: nothing of ours is left to keep)."""

    def __init__(self, client: redis.Redis[str], key: str, token: str, ttl_ms: int) -> None:
        self.client, self.key, self.token, self.ttl_ms = client, key, token, max(1, ttl_ms)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._keep, name=f"lease:{self.key}", daemon=True)
            self._thread.start()

    def _keep(self) -> None:
        renew = self.client.register_script(_RENEW)
        while not self._stop.wait(self.ttl_ms / 3000):
            try:
                if not renew(keys=[self.key], args=[self.token, self.ttl_ms]):
                    return  # not ours any more: nothing to keep
            except redis.RedisError:
                continue  # Redis away for a moment: try again; the key lasts a TTL meanwhile

    def stop(self) -> None:
        """Stop renewing (the key keeps the TTL of its last renewal)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


class Lease:
    """One attempt to hold `key` for `ttl_s` seconds (renewed while held, with `renew`)."""

    def __init__(
        self, client: redis.Redis[str], key: str, ttl_s: float, renew: bool = False, holder: str = ""
    ) -> None:
        self.client, self.key, self.ttl_ms = client, key, max(1, int(ttl_s * 1000))
        self.token = f"{holder}:{uuid.uuid4().hex}" if holder else uuid.uuid4().hex
        self.renew = renew
        self._renewer = Renewer(client, key, self.token, self.ttl_ms)

    def acquire(self, wait_s: float = 0.0) -> bool:
        """Take the lock, waiting up to `wait_s` for another holder to let it go; whether it is ours."""
        deadline = time.monotonic() + wait_s
        while not self.client.set(self.key, self.token, nx=True, px=self.ttl_ms):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        if self.renew:
            self._renewer.start()
        return True

    def release(self) -> None:
        """Let the lock go, if it is still ours; stop renewing it."""
        self._renewer.stop()
        self.client.register_script(_RELEASE)(keys=[self.key], args=[self.token])
