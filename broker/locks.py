"""Locks in Redis held under a token of the holder's own: only the holder renews or releases its lock, so
a holder whose lock expired never deletes the next holder's. A lease can renew itself while its work runs
(every third of its TTL, from a daemon thread), so work that takes longer than the TTL (a reaper pass whose
provider call hangs until its timeout) keeps the lock; a holder that dies stops renewing, and its lock
expires one TTL later."""

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


class Lease:
    """One attempt to hold `key` for `ttl_s` seconds (renewed while held, with `renew`)."""

    def __init__(
        self, client: redis.Redis[str], key: str, ttl_s: float, renew: bool = False, holder: str = ""
    ) -> None:
        self.client, self.key, self.ttl_ms = client, key, max(1, int(ttl_s * 1000))
        self.token = f"{holder}:{uuid.uuid4().hex}" if holder else uuid.uuid4().hex
        self.renew = renew
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def acquire(self, wait_s: float = 0.0) -> bool:
        """Take the lock, waiting up to `wait_s` for another holder to let it go; whether it is ours."""
        deadline = time.monotonic() + wait_s
        while not self.client.set(self.key, self.token, nx=True, px=self.ttl_ms):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        if self.renew:
            self._renewer = threading.Thread(target=self._keep, name=f"lease:{self.key}", daemon=True)
            self._renewer.start()
        return True

    def _keep(self) -> None:
        renew = self.client.register_script(_RENEW)
        while not self._stop.wait(self.ttl_ms / 3000):
            try:
                if not renew(keys=[self.key], args=[self.token, self.ttl_ms]):
                    return  # not ours any more (it expired while Redis was away): nothing to keep
            except redis.RedisError:
                continue  # Redis away for a moment: try again; the lock lasts a TTL meanwhile

    def release(self) -> None:
        """Let the lock go, if it is still ours; stop renewing it."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(5)
        self.client.register_script(_RELEASE)(keys=[self.key], args=[self.token])
