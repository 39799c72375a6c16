"""Orchestrator app factory: the pool's front door for workers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.chain.keyfile import load_key
from prime_swarm.libs.guard.asgi import BodyGuard
from prime_swarm.libs.guard.errors import install_validation_handler
from prime_swarm.libs.guard.ratelimit import RateLimiter
from prime_swarm.libs.observability.http import add_observability_routes
from prime_swarm.libs.rollout.stacks import pool_releases
from prime_swarm.libs.streams.connection import connect_async
from prime_swarm.libs.streams.replication import ReplicaWait, has_replicas
from prime_swarm.protocol.auth import SignedRequest, redis_nonce_burner
from prime_swarm.protocol.messages import PoolRequirements

from .board import RelayWatch, StatusBoard
from .deps import Pool
from .ejector import eject_silent_workers
from .routes import router
from .settings import OrchestratorSettings
from .standing import StandingBook, watch_standing_events
from .state import LeaseBook, PolicyTracker, WorkerRoster
from .status import router as status_router


def create_app(settings: OrchestratorSettings) -> FastAPI:
    # Read before serving: a bad key file stops start-up with one line, not a lifespan traceback.
    owner_account = load_key(settings.owner_key_file) if settings.owner_key_file else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        redis = connect_async(settings.redis_url, socket_timeout=5)
        ledger = LedgerClient(
            settings.rpc_url,
            settings.ledger_address,
            account=None,
            timeout=settings.chain_timeout_s,
            request_timeout=settings.chain_timeout_s,
        )
        limiter = RateLimiter(redis)
        policy = PolicyTracker(redis, settings)
        relays = RelayWatch(
            settings.relays, settings.relay_check_interval_s, settings.relay_check_timeout_s
        )
        recipe = settings.recipe
        requirements = PoolRequirements(
            pool_id=settings.pool_id,
            stacks=recipe.stacks,
            environments=pool_releases([x.env for x in recipe.shares()]),
            tool_python=recipe.pinned_tool_python(),
        )
        app.state.pool = Pool(
            requirements=requirements,
            settings=settings,
            redis=redis,
            policy=policy,
            leases=LeaseBook(
                redis,
                settings,
                lambda worker: asyncio.to_thread(ledger.work_id_floor, settings.pool_id, worker),
                ReplicaWait(
                    has_replicas(settings.redis_url) and settings.replica_wait_ms > 0,
                    settings.replica_wait_ms,
                ),
            ),
            workers=WorkerRoster(redis, settings),
            standing=StandingBook(
                ledger,
                limiter,
                settings.pool_id,
                settings.standing_cache_s,
                settings.chain_lookup_rate,
            ),
            limiter=limiter,
            board=StatusBoard(redis, settings, policy, relays),
        )
        app.state.auth = SignedRequest(redis_nonce_burner(redis), settings.max_clock_skew_s)
        tasks = [
            asyncio.create_task(
                watch_standing_events(app.state.pool.standing, settings.standing_events_poll_s)
            )
        ]
        if owner_account is not None:
            owner = LedgerClient(
                settings.rpc_url,
                settings.ledger_address,
                account=owner_account,
                timeout=settings.chain_timeout_s,
                request_timeout=settings.chain_timeout_s,
            )
            tasks.append(
                asyncio.create_task(eject_silent_workers(app.state.pool.workers, owner, settings))
            )
        yield
        for task in tasks:
            task.cancel()
        relays.close()
        await redis.aclose()

    app = FastAPI(title="Prime Swarm orchestrator", lifespan=lifespan)
    # Every route takes a JSON body, or none; nothing else is read, and nothing larger than the
    # recipe's largest honest batch of submissions.
    app.add_middleware(BodyGuard, max_bytes=settings.body_cap(), json_only=True)
    install_validation_handler(app)
    app.include_router(router)
    app.include_router(status_router)
    add_observability_routes(app, lambda: {"service": "orchestrator", "pool": settings.pool_id})
    return app
