"""Read routes, identical in origin and relay mode."""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import FileResponse
from starlette.types import Message, Receive, Scope, Send

from prime_swarm.libs.shardcast import NotHeldError
from prime_swarm.protocol.messages import RelayVersions

from .metrics import RelayMetrics
from .state import RelayState, get_state

router = APIRouter()

# Shards never change once written (a version is immutable), so caches may keep them forever.
IMMUTABLE = "public, max-age=31536000, immutable"


class ShardResponse(FileResponse):
    """FileResponse (streams from disk, handles HEAD and Range) that counts what it sends."""

    chunk_size = 1024 * 1024

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


@router.api_route("/v1/versions/{version}/files/{name}/shards/{index}", methods=["GET", "HEAD"])
def shard(
    version: int, name: str, index: int, request: Request, state: RelayState = Depends(get_state)
) -> Response:
    if version < 0 or index < 0:
        raise NotHeldError(f"no shard {index} of version {version}")
    _, info = state.store.locate(version, name, index)
    path = state.store.shard_path(version, name, index)
    try:
        # Stat here, not in the response: a shard missing (not pulled yet, or just evicted) is a
        # clean 404 instead of an error halfway through a response.
        st = os.stat(path)
    except FileNotFoundError:
        raise NotHeldError(f"shard {index} of {name} (version {version}) is not held yet") from None
    etag = f'"{info.sha256}"'
    headers = {"ETag": etag, "Cache-Control": IMMUTABLE}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    if request.method == "GET":
        state.metrics.shards_served.inc()
    return ShardResponse(
        path, state.metrics, stat_result=st, headers=headers, media_type="application/octet-stream"
    )
