"""FastAPI dependencies: the objects each route needs, built once per app."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import partial

from fastapi import Request
from redis.asyncio import Redis

from prime_swarm.libs.chain.client import LedgerClient

from .settings import OrchestratorSettings
from .state import LeaseBook, PolicyTracker


@dataclass
class Pool:
    settings: OrchestratorSettings
    redis: Redis
    policy: PolicyTracker
    leases: LeaseBook
    ledger: LedgerClient

    async def in_good_standing(self, worker: str) -> bool:
        """A member whose stake (after any slashing) still covers the pool's minimum."""
        loop = asyncio.get_running_loop()  # web3 is synchronous; keep it off the event loop
        pool_id = self.settings.pool_id
        if not await loop.run_in_executor(None, partial(self.ledger.is_member, pool_id, worker)):
            return False
        stake = await loop.run_in_executor(None, partial(self.ledger.stake_of, pool_id, worker))
        pool = await loop.run_in_executor(None, partial(self.ledger.get_pool, pool_id))
        return stake >= pool.min_stake


def get_pool(request: Request) -> Pool:
    return request.app.state.pool


async def get_signer(request: Request) -> str:
    """The verified EIP-191 signer of this request (401 otherwise)."""
    return await request.app.state.auth(request)
