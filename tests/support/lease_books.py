"""A `LeaseBook` on a real Redis, as the orchestrator builds it, for tests of the lease scripts
and the task stream (tests/integration/test_lease_grant.py, test_lease_mixture.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.asyncio import Redis as AsyncRedis

from prime_swarm.libs.streams.connection import connect_async
from prime_swarm.services.orchestrator.settings import OrchestratorSettings
from prime_swarm.services.orchestrator.state import LeaseBook

T = TypeVar("T")


def lease_book(r: AsyncRedis, **settings: Any) -> LeaseBook:
    """A pool's lease book; `settings` override the orchestrator's (a ledger nobody calls)."""

    async def floor(worker: str) -> int:
        return 0

    return LeaseBook(
        r, OrchestratorSettings(ledger_address="0x" + "5f" * 20, pool_id=1, **settings), floor
    )


def run(url: str, body: Callable[[AsyncRedis], Awaitable[T]]) -> T:
    """`body` run on a fresh async client of `url`, closed after."""

    async def main() -> T:
        r = connect_async(url, socket_timeout=10)
        try:
            return await body(r)
        finally:
            await r.aclose()

    return asyncio.run(main())
