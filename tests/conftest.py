"""Fixtures shared by every test layer: a real redis-server on a free port."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from prime_swarm.libs.localnet.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    root: Path = tmp_path_factory.mktemp("redis")
    server = RedisServer(root / "data", root / "logs")
    yield server
    server.stop()


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()
