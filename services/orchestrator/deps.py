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

    async def is_member(self, worker: str) -> bool:
        # web3 is synchronous; keep it off the event loop.
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            None, partial(self.ledger.is_member, self.settings.pool_id, worker)
        )


def get_pool(request: Request) -> Pool:
    return request.app.state.pool


async def get_signer(request: Request) -> str:
    """The verified EIP-191 signer of this request (401 otherwise)."""
    return await request.app.state.auth(request)
