"""Fixtures shared by every test layer: a real redis-server on a free port."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from prime_swarm.libs.localnet.redis_server import RedisServer

# Test helpers that are not fixtures (tests/support/*.py), importable by name: pytest runs with
# --import-mode=importlib, which puts no test directory on sys.path.
sys.path.insert(0, str(Path(__file__).with_name("support")))


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
