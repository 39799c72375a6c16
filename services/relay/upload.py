"""Origin-only routes: the trainer uploads a signed manifest, then its shards."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import ValidationError

from prime_swarm.libs.shardcast import (
    ManifestLayoutError,
    ShardHashError,
    ShardTooLargeError,
    VersionConflictError,
)
from prime_swarm.protocol.manifest_signing import ManifestError, verify_manifest
from prime_swarm.protocol.messages import SignedManifest

from .state import RelayState, get_state

router = APIRouter()
log = logging.getLogger(__name__)


def _declared_length(request: Request) -> int | None:
    value = request.headers.get("content-length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        raise HTTPException(400, "malformed Content-Length") from None


def _after_write(state: RelayState, version: int, list_missing: bool = False) -> dict[str, object]:
    complete = state.store.mark_complete(version)
    if complete:
        evicted = state.store.evict(state.settings.keep_versions)
        if evicted:
            log.info("evicted versions %s", evicted, extra={"evicted": evicted})
    reply: dict[str, object] = {"version": version, "complete": complete}
    reply["missing_shards"] = 0 if complete else state.store.missing_count(version)
    if list_missing:  # the uploader skips what the store linked from an earlier version
        missing = [] if complete else state.store.missing_shards(version)
        reply["missing"] = [[f.name, s.index] for f, s in missing]
    return reply


@router.put("/v1/versions/{version}/manifest", status_code=200)
async def put_manifest(
    version: int, request: Request, state: RelayState = Depends(get_state)
) -> dict[str, object]:
    cap = state.settings.max_manifest_bytes
    declared = _declared_length(request)
    if declared is not None and declared > cap:
        raise HTTPException(413, f"manifest larger than {cap} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > cap:
            raise HTTPException(413, f"manifest larger than {cap} bytes")
    try:
        signed = SignedManifest.model_validate_json(bytes(body))
    except ValidationError as exc:
        raise HTTPException(400, f"not a SignedManifest: {exc.errors()[0]['msg']}") from None
    if signed.manifest.version != version:
        raise HTTPException(
            400, f"manifest is for version {signed.manifest.version}, not {version}"
        )
    try:
        verify_manifest(signed, state.settings.trusted_trainer)
    except ManifestError as exc:
        log.warning("refused manifest for version %s: %s", version, exc, extra={"version": version})
        raise HTTPException(403, f"manifest refused: {exc}") from None
    try:
        new = state.store.put_manifest(signed)
    except ManifestLayoutError as exc:
        raise HTTPException(400, str(exc)) from None
    except VersionConflictError as exc:
        raise HTTPException(409, str(exc)) from None
    if new:
        log.info("manifest of version %s accepted", version, extra={"version": version})
    return _after_write(state, version, list_missing=True)


@router.put("/v1/versions/{version}/files/{name}/shards/{index}")
async def put_shard(
    version: int, name: str, index: int, request: Request, state: RelayState = Depends(get_state)
) -> dict[str, object]:
    _, info = state.store.locate(version, name, index)
    declared = _declared_length(request)
    if declared is not None and declared > info.size:
        raise HTTPException(413, f"shard is {info.size} bytes, upload declares {declared}")
    try:
        # Plain blocking writes on the event loop: each chunk is one page-cache write (~µs),
        # cheaper than a thread hop per chunk.
        with state.store.open_shard_writer(version, name, index) as writer:
            async for chunk in request.stream():
                writer.write(chunk)
            writer.commit()
    except ShardTooLargeError as exc:
        state.metrics.shards_rejected.inc()
        raise HTTPException(413, str(exc)) from None
    except ShardHashError as exc:
        state.metrics.shards_rejected.inc()
        raise HTTPException(400, str(exc)) from None
    state.metrics.shards_received.inc()
    return _after_write(state, version)
