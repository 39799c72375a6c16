"""Read routes, identical in origin and relay mode."""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import FileResponse
from starlette.types import Message, Receive, Scope, Send

from prime_swarm.libs.shardcast import NotHeldError, routes
from prime_swarm.libs.shardcast.follow import FollowBroken, ShardFollower
from prime_swarm.libs.shardcast.store import ShardWriter
from prime_swarm.protocol.messages import RelayVersions

from .metrics import RelayMetrics
from .state import RelayState, get_state

log = logging.getLogger(__name__)
T = TypeVar("T")
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


class FollowResponse(Response):
    """Streams a shard this node is still receiving (byte-level cut-through, `follow.py`)."""

    def __init__(
        self, follower: ShardFollower, metrics: RelayMetrics, headers: dict[str, str]
    ) -> None:
        headers = {**headers, "Content-Length": str(follower.length)}
        if follower.start:
            size = follower.writer.shard.size
            headers["Content-Range"] = f"bytes {follower.start}-{size - 1}/{size}"
        super().__init__(
            status_code=206 if follower.start else 200,
            headers=headers,
            media_type="application/octet-stream",
        )
        self._follower = follower
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        if scope["method"] == "HEAD":
            self._follower.close()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        try:
            async for chunk in self._follower.chunks():
                self._metrics.bytes_served.inc(len(chunk))
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except FollowBroken as exc:
            # Returning with the body short makes the server drop the connection: the reader
            # sees a cut transfer and takes the shard from another relay.
            log.warning("cut-through stream cut: %s", exc)
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


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


_GONE = object()  # `_wait_for_shard`: stop waiting, the version is gone or complete


async def _poll(ready: Callable[[], T | None], seconds: float) -> T | None:
    """`ready()` once it is not None, polled with a growing pause (5 ms to 50 ms: a shard in
    flight is usually seconds away), or None after `seconds`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    pause = 0.005
    while (found := ready()) is None and loop.time() < deadline:
        await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
        pause = min(pause * 2, 0.05)
    return found


async def _wait_for_manifest(state: RelayState, version: int, wait: float) -> None:
    """Hold a shard request briefly for a version this relay has not seen yet.

    A client learns of a version from whichever relay polled first and asks every relay for
    shards at once; answered with a 404, it takes each of those shards from the other relays
    whole, and on a shaped tree one relay ended up serving all 8 clients (47 s instead of 25 s).
    The hold is bounded by about two polls of the parents, so requests for versions that do not
    exist cannot pile up for long.
    """
    settings = state.settings
    if settings.mode != "relay":
        return  # the origin hears of a version first: nobody can ask it early
    hold = min(wait, 2 * settings.poll_interval_s + 1.0)
    await _poll(lambda: state.store.get_manifest(version), hold)


async def _wait_for_shard(
    state: RelayState, version: int, name: str, index: int, path: Path, wait: float
) -> os.stat_result | ShardWriter | None:
    """Cut-through: hold the request until this relay holds the shard or starts receiving it."""

    def arrived() -> os.stat_result | ShardWriter | object | None:
        if state.store.get_manifest(version) is None or state.store.is_complete(version):
            return _GONE  # evicted, or complete without this file (cannot happen)
        writer = state.store.writer_of(version, name, index)
        # Followed once its first byte is here: until then a wait that runs out is a clean
        # 404, not a response cut off before its body.
        if writer is not None and writer.readable > 0:
            return writer
        return _stat(path)

    found = await _poll(arrived, wait)
    return found if isinstance(found, (os.stat_result, ShardWriter)) else _stat(path)


_OPEN_RANGE = re.compile(r"bytes=(\d{1,19})-")


def _follow(
    writer: ShardWriter, request: Request, wait: float, state: RelayState, headers: dict[str, str]
) -> Response | None:
    """A response streaming `writer`'s shard, or None if the writer is already done."""
    # Only the open range a resuming client sends; anything else gets the whole shard (200),
    # which every client handles.
    m = _OPEN_RANGE.fullmatch(request.headers.get("range", ""))
    start = int(m.group(1)) if m and int(m.group(1)) < writer.shard.size else 0
    try:
        # Silent upstream for the relay's own read timeout: its pull is failing and will resume
        # or reset the writer (which cuts this stream anyway). Cutting at the client's `wait`
        # (5 s) cut 24 followers of one relay in the time-to-64 run while its pull, starved of
        # CPU, paused and went on.
        follower = ShardFollower(
            writer, start, idle_timeout_s=wait + state.settings.request_timeout_s
        )
    except FileNotFoundError:
        return None
    return FollowResponse(follower, state.metrics, headers)


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
    if wait > 0 and state.store.get_manifest(version) is None:
        await _wait_for_manifest(state, version, wait)
    _, info = state.store.locate(version, name, index)
    path = state.store.shard_path(version, name, index)
    # Stat here, not in the response: a shard missing (not pulled yet, or just evicted) is a
    # clean 404 instead of an error halfway through a response.
    st = _stat(path)
    etag = f'"{info.sha256}"'
    headers = {"ETag": etag, "Cache-Control": IMMUTABLE}
    if st is None and wait > 0:
        found = await _wait_for_shard(state, version, name, index, path, wait)
        if isinstance(found, ShardWriter):
            followed = _follow(found, request, wait, state, headers)
            if followed is not None:
                if request.method == "GET":
                    state.metrics.shards_served.inc()
                return followed
            found = _stat(path)  # committed (or failed) just now
        st = found
    if st is None:
        raise NotHeldError(f"shard {index} of {name} (version {version}) is not held yet")
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    if request.method == "GET":
        state.metrics.shards_served.inc()
    return ShardResponse(
        path, state.metrics, stat_result=st, headers=headers, media_type="application/octet-stream"
    )
