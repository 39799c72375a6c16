"""FastAPI app factory for the relay binary (origin and relay mode)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from prime_swarm.libs.shardcast import NotHeldError, UnsafeNameError, VersionStore

from . import serving, upload
from .metrics import RelayMetrics
from .puller import Puller
from .settings import RelaySettings
from .state import RelayState

log = logging.getLogger(__name__)


def create_app(settings: RelaySettings) -> FastAPI:
    store = VersionStore(settings.data_dir)
    state = RelayState(settings=settings, store=store, metrics=RelayMetrics(store, settings.mode))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        puller = Puller(settings, store, state.metrics) if settings.mode == "relay" else None
        log.info(
            "relay up",
            extra={"mode": settings.mode, "data_dir": str(store.root), "held": store.versions()},
        )
        if puller is not None:
            puller.start()
        try:
            yield
        finally:
            if puller is not None:
                puller.stop()

    app = FastAPI(title=f"prime-relay ({settings.mode})", lifespan=lifespan)
    app.state.relay = state
    app.include_router(serving.router)
    if settings.mode == "origin":
        app.include_router(upload.router)

    @app.exception_handler(NotHeldError)
    async def _not_held(request: Request, exc: NotHeldError) -> JSONResponse:
        return JSONResponse(
            {"detail": str(exc), "held_versions": store.versions()}, status_code=404
        )

    @app.exception_handler(UnsafeNameError)
    async def _unsafe(request: Request, exc: UnsafeNameError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    return app
