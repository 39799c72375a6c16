"""Read routes, identical in origin and relay mode."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import FileResponse
from starlette.types import Message, Receive, Scope, Send

from prime_swarm.libs.shardcast import NotHeldError, routes
from prime_swarm.protocol.messages import RelayVersions

from .metrics import RelayMetrics
from .state import RelayState, get_state

router = APIRouter()

# Shards never change once written (a version is immutable), so caches may keep them forever.
IMMUTABLE = "public, max-age=31536000, immutable"


class ShardResponse(FileResponse):
    """FileResponse (streams from disk, handles HEAD and Range) that counts what it sends."""

    chunk_size = 4 * 1024 * 1024

    def __init__(self, path: Path, metrics: RelayMetrics, **kwargs: object) -> None:
        super().__init__(path, **kwargs)  # type: ignore[arg-type]
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.body":
                self._metrics.bytes_served.inc(len(message.get("body", b"")))
            await send(message)

        await super().__call__(scope, receive, counting_send)


@router.get("/healthz")
def healthz(state: RelayState = Depends(get_state)) -> dict[str, object]:
    return {
        "status": "ok",
        "service": "relay",
        "mode": state.settings.mode,
        "latest": state.store.latest(),
    }


@router.get("/metrics")
def metrics(state: RelayState = Depends(get_state)) -> Response:
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")


@router.get("/v1/versions", response_model=RelayVersions)
def versions(state: RelayState = Depends(get_state)) -> RelayVersions:
    held = state.store.versions()
    return RelayVersions(versions=held, latest=held[-1] if held else None)


@router.get("/v1/versions/partial", response_model=RelayVersions)
def partial_versions(state: RelayState = Depends(get_state)) -> RelayVersions:
    """Versions still arriving: their manifest and held shards are served already."""
    held = state.store.partial_versions()
    return RelayVersions(versions=held, latest=held[-1] if held else None)


@router.get("/v1/versions/{version}/manifest")
def manifest(version: int, state: RelayState = Depends(get_state)) -> Response:
    signed = state.store.get_manifest(version) if version >= 0 else None
    if signed is None:
        raise NotHeldError(f"version {version} is not held (never published here, or evicted)")
    return Response(
        signed.model_dump_json(),
        media_type="application/json",
        headers={"Cache-Control": IMMUTABLE},
    )


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


async def _wait_for_shard(
    state: RelayState, version: int, path: Path, wait: float
) -> os.stat_result | None:
    """Cut-through: hold the request while this relay is still pulling the shard."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    pause = 0.005
    while loop.time() < deadline:
        if state.store.get_manifest(version) is None or state.store.is_complete(version):
            break  # evicted, or complete without this file (cannot happen) : stop waiting
        await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
        pause = min(pause * 2, 0.05)
        st = _stat(path)
        if st is not None:
            return st
    return _stat(path)


@router.api_route("/v1/versions/{version}/files/{name}/shards/{index}", methods=["GET", "HEAD"])
async def shard(
    version: int,
    name: str,
    index: int,
    request: Request,
    wait: float = Query(default=0.0, ge=0.0, le=routes.MAX_WAIT_S),
    state: RelayState = Depends(get_state),
) -> Response:
    """One verified shard. `?wait=S` holds the request up to S seconds while it is in flight."""
    if version < 0 or index < 0:
        raise NotHeldError(f"no shard {index} of version {version}")
    _, info = state.store.locate(version, name, index)
    path = state.store.shard_path(version, name, index)
    # Stat here, not in the response: a shard missing (not pulled yet, or just evicted) is a
    # clean 404 instead of an error halfway through a response.
    st = _stat(path)
    if st is None and wait > 0:
        st = await _wait_for_shard(state, version, path, wait)
    if st is None:
        raise NotHeldError(f"shard {index} of {name} (version {version}) is not held yet")
    etag = f'"{info.sha256}"'
    headers = {"ETag": etag, "Cache-Control": IMMUTABLE}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    if request.method == "GET":
        state.metrics.shards_served.inc()
    return ShardResponse(
        path, state.metrics, stat_result=st, headers=headers, media_type="application/octet-stream"
    )
