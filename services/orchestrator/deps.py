"""FastAPI dependencies: the objects each route needs, built once per app, and the caller every
signed route starts from: signed, rate-limited, the worker its body names, in this pool, and
(as the route needs) registered and in good standing. A route names what it needs by type
(`Caller`, `RegisteredWorker`, `StandingWorker`); each refusal is labelled with the route's own
name, read from the request."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from redis.asyncio import Redis

from prime_swarm.libs.chain.errors import ChainError
from prime_swarm.libs.guard.ratelimit import Limited, RateLimiter
from prime_swarm.protocol.messages import PoolRequirements, WorkerClaim, normal_address
from prime_swarm.protocol.signing import AuthError, require_signer_is

from . import metrics
from .board import StatusBoard
from .settings import OrchestratorSettings
from .standing import StandingBook
from .state import LeaseBook, PolicyTracker, WorkerRoster

log = logging.getLogger("orchestrator")


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
    requirements: PoolRequirements
    """What a machine must run to work for the pool, worked out once at start."""


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


async def get_route_name(request: Request) -> str:
    # The route's `name` (its function's unless set): its rate limit's key, its metrics label.
    return request.scope["route"].name


RouteName = Annotated[str, Depends(get_route_name)]


async def get_signer(request: Request, pool: PoolDep, route: RouteName) -> str:
    """The verified EIP-191 signer of this request (401 otherwise), as an `Address`, counted
    against the signer's limit for this route (429). The signature comes first: a forged
    address must not spend someone else's allowance."""
    signer = normal_address(await request.app.state.auth(request))
    try:
        await pool.limiter.hit(f"{route}:{signer}", getattr(pool.settings.rate_limits, route))
    except Limited as exc:
        raise rate_limited(route, exc) from None
    return signer


Signer = Annotated[str, Depends(get_signer)]


async def read_claim(request: Request) -> WorkerClaim:
    """The `worker` and `pool_id` of the JSON body. FastAPI has parsed the body before any
    dependency runs, and the request keeps it, so this validates two fields, not the body
    again; one that does not validate is answered as any invalid body is (422)."""
    try:
        data = await request.json() if await request.body() else None
        return WorkerClaim.model_validate(data)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None
    except ValueError:  # not JSON: FastAPI refuses it first, unless no content type said JSON
        raise RequestValidationError(
            [{"type": "json_invalid", "loc": ("body",), "msg": "JSON decode error"}]
        ) from None


async def get_caller(request: Request, signer: Signer, pool: PoolDep, route: RouteName) -> str:
    """The worker the body names, which must be the signer (403: nobody acts for another) and a
    worker of this orchestrator's pool (404). Checked before the rest of the body is
    validated: a caller refused here costs no more than its signature."""
    claim = await read_claim(request)
    try:
        require_signer_is(signer, claim.worker)
    except AuthError as exc:
        raise refuse(route, exc.status, exc.reason, "foreign_signer") from exc
    if claim.pool_id != pool.settings.pool_id:
        raise refuse(
            route, 404, f"this orchestrator serves pool {pool.settings.pool_id}", "wrong_pool"
        )
    return claim.worker


Caller = Annotated[str, Depends(get_caller)]


async def get_registered_worker(worker: Caller, pool: PoolDep, route: RouteName) -> str:
    """The caller, registered with this orchestrator (403 otherwise)."""
    if not await pool.workers.is_registered(worker):
        raise refuse(
            route, 403, "worker is not registered; call /v1/register first", "not_registered"
        )
    return worker


RegisteredWorker = Annotated[str, Depends(get_registered_worker)]


async def require_standing(route: str, pool: Pool, worker: str) -> None:
    """Stake is enforced on every lease and submission, not only at registration: a worker who
    left (unbonding) or was slashed below the minimum stops here within `standing_cache_s`."""
    try:
        standing = await pool.standing.of(worker)
    except Limited as exc:
        raise rate_limited(route, exc) from None
    except ChainError as exc:  # the node is down or slow: the worker should retry, not give up
        log.warning("standing lookup failed: %s", exc)
        raise refuse(
            route,
            503,
            "the pool's chain node is unreachable; retry",
            "chain_unavailable",
            headers={"Retry-After": "5"},
        ) from None
    if not standing.ok:
        raise refuse(route, 403, standing.explain(worker, pool.settings.pool_id), standing.verdict)


async def get_standing_worker(worker: RegisteredWorker, pool: PoolDep, route: RouteName) -> str:
    """The caller, registered and in good standing on chain (403, or 503 with no chain)."""
    await require_standing(route, pool, worker)
    return worker


StandingWorker = Annotated[str, Depends(get_standing_worker)]
