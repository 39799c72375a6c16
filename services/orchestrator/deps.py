"""FastAPI dependencies: the objects each route needs, built once per app, and the signed,
rate-limited caller every route starts from."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from redis.asyncio import Redis

from prime_swarm.libs.guard.ratelimit import Limited, RateLimiter
from prime_swarm.protocol.messages import normal_address

from . import metrics
from .board import StatusBoard
from .settings import OrchestratorSettings
from .standing import StandingBook
from .state import LeaseBook, PolicyTracker, WorkerRoster


@dataclass
class Pool:
    settings: OrchestratorSettings
    redis: Redis
    policy: PolicyTracker
    leases: LeaseBook
    workers: WorkerRoster
    standing: StandingBook
    limiter: RateLimiter
    board: StatusBoard


async def get_pool(request: Request) -> Pool:
    # async on purpose: FastAPI runs a sync dependency on its thread pool, and that hand-off
    # was a quarter of the orchestrator's CPU per request (bench-orchestrator's py-spy).
    return request.app.state.pool


PoolDep = Annotated[Pool, Depends(get_pool)]


def refuse(
    route: str, status: int, reason: str, code: str, headers: dict[str, str] | None = None
) -> HTTPException:
    metrics.REQUESTS_REFUSED.labels(route, code).inc()
    return HTTPException(
        status_code=status, detail={"reason": code, "message": reason}, headers=headers
    )


def rate_limited(route: str, exc: Limited) -> HTTPException:
    wait = max(1, math.ceil(exc.retry_after_s))
    return refuse(
        route,
        429,
        f"rate limit of {route} reached; retry in {exc.retry_after_s:.2f}s",
        "rate_limited",
        headers={"Retry-After": str(wait)},
    )


async def get_signer(request: Request, pool: PoolDep) -> str:
    """The verified EIP-191 signer of this request (401 otherwise), as an `Address`, counted
    against the signer's limit for this route (429). The signature comes first: a forged
    address must not spend someone else's allowance."""
    signer = normal_address(await request.app.state.auth(request))
    route = request.scope["route"].name
    try:
        await pool.limiter.hit(f"{route}:{signer}", getattr(pool.settings.rate_limits, route))
    except Limited as exc:
        raise rate_limited(route, exc) from None
    return signer


Signer = Annotated[str, Depends(get_signer)]
