"""How the fleet reaches its Redis from `REDIS_URL`: redis://, rediss:// and unix:// as redis-py reads them,
or Redis Sentinel, `redis+sentinel://[:password@]host:port[,host:port...]/master[/db]` (the sentinels, then
the name they watch the master under): every client asks the sentinels where the master is now, and asks
again after a failover. The password is the master's; the sentinels are asked without one.

Redis Cluster is refused: Celery's Redis transport (kombu) does not speak it, and the fleet's scripts each
touch a run's keys and the fleet-wide ones (the parked runs, the lease keys) in one atomic call, which a
cluster allows only within one hash slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import redis
from redis.sentinel import Sentinel

SENTINEL_SCHEME = "redis+sentinel"
SCHEMES = ("redis", "rediss", "unix", SENTINEL_SCHEME)
FORMS = (
    "redis://[:password@]host[:port]/db, rediss://... (TLS), unix:///path/redis.sock?db=0, or "
    f"{SENTINEL_SCHEME}://[:password@]host:port[,host:port...]/master[/db] (Redis Sentinel)"
)
SENTINEL_PORT = 26379


@dataclass(frozen=True)
class SentinelUrl:
    """A Sentinel URL's parts: where the sentinels are, the master's name under them, its db and password."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    password: str | None = None


def check(url: str) -> None:
    """ValueError, saying which forms are accepted (never quoting the URL: its password), unless redis-py and
    Celery can both reach a Redis at `url`."""
    scheme = url.partition("://")[0]
    if "cluster" in scheme:
        raise ValueError(
            "Redis Cluster is not supported (Celery's Redis transport does not speak it, and the fleet's "
            "scripts change several keys at once): use one Redis, with Sentinel for failover (" + FORMS + ")"
        )
    if scheme not in SCHEMES:
        raise ValueError("must be " + FORMS)
    if scheme == SENTINEL_SCHEME:
        sentinel_parts(url)


def sentinel_parts(url: str) -> SentinelUrl:
    """The parts of a Sentinel URL; ValueError (naming what is wrong, never the password) if it is none."""
    parts = urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        raise ValueError(f"not a {SENTINEL_SCHEME}:// URL")
    auth, _, hosts = parts.netloc.rpartition("@")
    sentinels = []
    for host in filter(None, hosts.split(",")):
        name, _, port = host.rpartition(":") if ":" in host else (host, "", "")
        if not name or (port and not port.isdigit()):
            raise ValueError(f"a sentinel must be host:port, not {host!r}")
        sentinels.append((name, int(port) if port else SENTINEL_PORT))
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not sentinels or not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError(f"must be {SENTINEL_SCHEME}://[:password@]host:port[,host:port...]/master[/db]")
    password = unquote(auth.partition(":")[2]) if auth else None
    return SentinelUrl(tuple(sentinels), path[0], int(path[1]) if len(path) == 2 else 0, password or None)


def shown(url: str) -> str:
    """The URL as it may be shown: its password, if any, as `***` (`redis://:***@host:6379/0`)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    auth, hosts = parts.netloc.rsplit("@", 1)
    user = auth.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hosts}"))


def connect(url: str, **options: Any) -> redis.Redis[str]:
    """A redis-py client for `url` (`options` as redis.Redis takes them: decode_responses, timeouts)."""
    if urlsplit(url).scheme != SENTINEL_SCHEME:
        return cast("redis.Redis[str]", redis.Redis.from_url(url, **options))
    parts = sentinel_parts(url)
    socket = {k: v for k, v in options.items() if k.startswith("socket_")}
    watch = Sentinel(list(parts.sentinels), sentinel_kwargs=socket)
    return cast(
        "redis.Redis[str]", watch.master_for(parts.master, db=parts.db, password=parts.password, **options)
    )


def kombu_url(url: str) -> tuple[str, dict[str, Any]]:
    """The broker URL and transport options kombu (Celery's transport) takes for a Sentinel URL: one
    `sentinel://` URL per sentinel, the master's name in the options."""
    parts = sentinel_parts(url)
    auth = f":{quote(parts.password, safe='')}@" if parts.password else ""
    urls = [f"sentinel://{auth}{host}:{port}/{parts.db}" for host, port in parts.sentinels]
    return ";".join(urls), {"master_name": parts.master}
