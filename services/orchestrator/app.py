"""Orchestrator app factory: the pool's front door for workers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.asyncio import Redis

from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.observability.http import add_observability_routes
from prime_swarm.protocol.auth import SignedRequest, redis_nonce_burner

from .deps import Pool
from .routes import router
from .settings import OrchestratorSettings
from .state import LeaseBook, PolicyTracker

MAX_BODY_BYTES = 4 * 1024 * 1024


def create_app(settings: OrchestratorSettings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        redis = Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=5)
        ledger = LedgerClient(
            settings.rpc_url,
            settings.ledger_address,
            account=None,
            timeout=settings.chain_timeout_s,
        )
        app.state.pool = Pool(
            settings=settings,
            redis=redis,
            policy=PolicyTracker(redis, settings),
            leases=LeaseBook(redis, settings),
            ledger=ledger,
        )
        app.state.auth = SignedRequest(redis_nonce_burner(redis), settings.max_clock_skew_s)
        yield
        await redis.aclose()

    app = FastAPI(title="Prime Swarm orchestrator", lifespan=lifespan)

    @app.middleware("http")
    async def limit_body(request: Request, call_next):  # type: ignore[no-untyped-def]
        # Refuse oversized bodies before reading them; a rollout group is far below this.
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            return JSONResponse(
                {"detail": {"reason": "too_large", "message": "body over 4 MiB"}}, 413
            )
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(
            {
                "detail": {
                    "reason": "malformed",
                    "message": "invalid request body",
                    "errors": exc.errors()[:10],
                }
            },
            status_code=422,
        )

    app.include_router(router)
    add_observability_routes(app, lambda: {"service": "orchestrator", "pool": settings.pool_id})
    return app
