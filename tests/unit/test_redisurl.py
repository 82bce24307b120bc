"""REDIS_URL's forms (core.redisurl): what is accepted, what is refused and how, and what Celery's transport
gets for a Sentinel URL."""

from __future__ import annotations

import pytest

from core.errors import ConfigError
from core.redisurl import SentinelUrl, check, kombu_url, sentinel_parts, shown
from core.settings import load_settings


@pytest.mark.parametrize(
    ("url", "seen"),
    [
        ("redis://:s3cret@10.0.0.5:6379/0", "redis://:***@10.0.0.5:6379/0"),
        ("rediss://fleet:s3cret@redis.example:6380/1", "rediss://fleet:***@redis.example:6380/1"),
        (
            "redis+sentinel://:s3cret@s1:26379,s2:26379/mymaster/0",
            "redis+sentinel://:***@s1:26379,s2:26379/mymaster/0",
        ),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("unix:///tmp/redis.sock?db=0", "unix:///tmp/redis.sock?db=0"),
    ],
)
def test_a_url_is_shown_without_its_password(url: str, seen: str) -> None:
    assert shown(url) == seen


def test_a_sentinel_url_names_its_sentinels_the_master_and_its_db() -> None:
    parts = sentinel_parts("redis+sentinel://:p%40ss@s1:26379,s2:26380,s3/fleet/2")
    assert parts == SentinelUrl((("s1", 26379), ("s2", 26380), ("s3", 26379)), "fleet", 2, "p@ss")
    assert sentinel_parts("redis+sentinel://s1:26379/fleet") == SentinelUrl((("s1", 26379),), "fleet")
    url, options = kombu_url("redis+sentinel://:p%40ss@s1:26379,s2:26380/fleet/2")
    assert url == "sentinel://:p%40ss@s1:26379/2;sentinel://:p%40ss@s2:26380/2"
    assert options == {"master_name": "fleet"}


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://s1:26379",  # no master
        "redis+sentinel:///fleet",  # no sentinel
        "redis+sentinel://s1:port/fleet",
        "redis+sentinel://s1:26379/fleet/zero",
        "redis+sentinel://s1:26379/fleet/0/extra",
    ],
)
def test_a_sentinel_url_without_its_parts_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="sentinel"):
        check(url)


def test_redis_cluster_and_other_schemes_are_refused_by_name_never_quoting_the_url() -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings({"REDIS_URL": "redis+cluster://:hunter2@c1:7000/0", "FLEET_SETTINGS_FILE": "/dev/null"})
    assert "Redis Cluster is not supported" in str(refused.value) and "hunter2" not in str(refused.value)
    with pytest.raises(ConfigError, match="redis\\+sentinel://") as other:
        load_settings({"REDIS_URL": "memcached://:hunter2@m:11211", "FLEET_SETTINGS_FILE": "/dev/null"})
    assert "hunter2" not in str(other.value)
    for fine in ("redis://:pw@h:6379/0", "rediss://h/1", "unix:///tmp/r.sock?db=0", "redis+sentinel://h:1/m"):
        check(fine)
