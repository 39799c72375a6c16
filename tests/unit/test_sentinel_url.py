"""`redis+sentinel://` URLs (libs/streams/connection.py): what every service is given when Redis
fails over, parsed strictly, with a one-line reason for each bad one."""

from __future__ import annotations

import pytest

from prime_swarm.libs.streams.connection import SentinelURL
from prime_swarm.libs.streams.replication import has_replicas


def test_a_full_url() -> None:
    url = SentinelURL.parse(
        "redis+sentinel://orchestrator:s3cr%40t@sentinel-1:26379,sentinel-2:26380/prime/2"
    )
    assert url.sentinels == (("sentinel-1", 26379), ("sentinel-2", 26380))
    assert (url.service, url.db) == ("prime", 2)
    assert (url.username, url.password) == ("orchestrator", "s3cr@t")


def test_defaults_without_credentials_or_database() -> None:
    url = SentinelURL.parse("redis+sentinel://127.0.0.1:5000/prime")
    assert url.connection_kwargs() == {"db": 0, "username": None, "password": None}


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis://127.0.0.1:6379/0", "not a redis.sentinel:// URL"),
        ("redis+sentinel://127.0.0.1/prime", "is not HOST:PORT"),
        ("redis+sentinel://a:1,b:x/prime", "is not HOST:PORT"),
        ("redis+sentinel://a:1/", "names no service"),
        ("redis+sentinel://a:1/prime/zero", "is not a number"),
    ],
)
def test_bad_urls_say_why(url: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        SentinelURL.parse(url)


def test_only_a_sentinel_url_waits_for_replicas() -> None:
    assert has_replicas("redis+sentinel://a:1/prime")
    assert not has_replicas("redis://127.0.0.1:6379/0")
