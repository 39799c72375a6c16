"""The trainer's side: hash, sign and upload a policy version to the origin."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from eth_account.signers.local import LocalAccount

from prime_swarm.protocol.manifest_signing import sign_manifest
from prime_swarm.protocol.messages import (
    FileDelta,
    FileEntry,
    Manifest,
    RelayVersions,
    ShardInfo,
    SignedManifest,
)

from . import delta, routes
from .client import fetch_manifest, list_versions, make_http_client
from .errors import PublishError
from .manifest import (
    DEFAULT_SHARD_SIZE,
    build_manifest,
    hash_file,
    iter_shard_bytes,
    served_files,
)

RETRY_PAUSE_S = 0.5
DELTA_MAX_FRACTION = 0.5
"""A delta larger than this share of its file is not offered: the full file is nearly as cheap
and clients would rebuild for little gain (fp32 weights after a large step, for one)."""


def publish_version(
    origin_url: str,
    model_dir: str | Path,
    version: int,
    parent_version: int | None,
    account: LocalAccount,
    shard_size: int = DEFAULT_SHARD_SIZE,
    timeout: float = 30.0,
    *,
    max_workers: int = 4,
    attempts_per_shard: int = 3,
    http: httpx.Client | None = None,
    parent_dir: str | Path | None = None,
    parent_manifest: Manifest | None = None,
) -> SignedManifest:
    """Upload `model_dir` as `version`; returns once the origin lists it as complete.

    Re-running after a failure is safe: the origin treats an identical manifest and shards as
    no-ops, and a version it already holds complete with these very files (a publisher killed
    after the upload, before it recorded success) is returned as it is. Edits to the directory
    during the upload are caught by the origin's hash checks.

    With `parent_dir` (the model directory of `parent_version`), every file that changed but
    kept its length is also offered as a lossless delta against the parent's file, when the
    delta is small enough to be worth a second path (`DELTA_MAX_FRACTION`). `parent_manifest`
    (the parent version as it was published) gives the parent files' hashes.
    """
    model_dir = Path(model_dir)
    with tempfile.TemporaryDirectory(prefix="prime-swarm-deltas-") as scratch:
        # Hashing the files and encoding the deltas both read every byte and both release the
        # GIL (hashlib, numpy, zstd): side by side they take the time of the longer one, and
        # the manifest, which every download waits for, exists sooner.
        with ThreadPoolExecutor(max_workers=2) as ex:
            building = ex.submit(
                build_manifest, model_dir, version, parent_version, shard_size, account.address
            )
            known = (
                {f.name: f.sha256 for f in parent_manifest.files}
                if parent_manifest is not None and parent_manifest.version == parent_version
                else None
            )
            encoding = (
                ex.submit(
                    encode_deltas,
                    model_dir,
                    Path(parent_dir),
                    Path(scratch),
                    shard_size,
                    parent_hashes=known,
                )
                if parent_dir is not None and parent_version is not None
                else None
            )
            manifest = building.result()
            if encoding is not None:
                manifest = manifest.model_copy(update={"deltas": encoding.result()})
        sources = {f.name: model_dir / f.name for f in manifest.files}
        sources.update({d.delta.name: Path(scratch) / d.delta.name for d in manifest.deltas})
        return _upload(
            origin_url,
            manifest,
            sources,
            account,
            timeout,
            max_workers=max_workers,
            attempts_per_shard=attempts_per_shard,
            http=http,
        )


def encode_deltas(
    model_dir: Path,
    parent_dir: Path,
    scratch: Path,
    shard_size: int,
    workers: int | None = None,
    parent_hashes: Mapping[str, str] | None = None,
) -> list[FileDelta]:
    """A delta for each file of `model_dir` that changed from `parent_dir`'s and kept its
    length, written to `scratch` as `<name>.delta`. Files are read a piece at a time, never
    whole: a shard file of several GB costs a few pieces of memory, not twice its size.
    `parent_hashes` (file name -> sha256, from the parent's manifest) spares hashing the
    parent's files again; a wrong one costs nothing but the shortcut, since a follower checks
    the file it rebuilds against the signed hash of the new one."""
    workers = workers or len(os.sched_getaffinity(0))
    names = {p.name for p in model_dir.iterdir() if p.is_file()}
    offered = []
    for fname in sorted(names):
        parent_file, name = parent_dir / fname, f"{fname}.delta"
        new_file = model_dir / fname
        size = new_file.stat().st_size
        if name in names or not parent_file.is_file() or parent_file.stat().st_size != size:
            continue
        if _sampled_share(parent_file, new_file) * delta.BYTES_PER_CHANGED_WORD / 2 > (
            DELTA_MAX_FRACTION
        ):
            continue  # most words changed (fp32 after a large step): not worth encoding
        known = (parent_hashes or {}).get(fname)
        body, parent_sha = delta.encode_files(parent_file, new_file, workers, known)
        if body is None or delta.changed_words(body) == 0 or len(body) > DELTA_MAX_FRACTION * size:
            continue  # unchanged files the origin, relays and clients link from the parent
        (scratch / name).write_bytes(body)
        entry = hash_file(scratch / name, name, shard_size)
        offered.append(FileDelta(name=fname, parent_sha256=parent_sha, delta=entry))
    return offered


def _sampled_share(parent: Path, new: Path, samples: int = 4096) -> float:
    """`delta.changed_share` of two files of one length, from `samples` words read one by one:
    a mapping would fault in 64 KiB around each sample, a quarter of a GB of a 1.5 GB pair."""
    words = new.stat().st_size // 2
    if words == 0:
        return 0.0
    step = max(1, words // samples)
    with open(parent, "rb", buffering=0) as a, open(new, "rb", buffering=0) as b:
        at = range(0, words * 2, step * 2)
        old = b"".join(os.pread(a.fileno(), 2, i) for i in at)
        now = b"".join(os.pread(b.fileno(), 2, i) for i in at)
    return delta.changed_share(old, now, samples=len(at))


def _upload(
    origin_url: str,
    manifest: Manifest,
    sources: dict[str, Path],
    account: LocalAccount,
    timeout: float,
    *,
    max_workers: int,
    attempts_per_shard: int,
    http: httpx.Client | None,
) -> SignedManifest:
    version = manifest.version
    client = http or make_http_client(timeout, max_connections=max_workers + 2)
    try:
        held = _already_complete(client, origin_url, manifest.model_hash, version, account, timeout)
        if held is not None:
            return held
        signed = sign_manifest(manifest, account)
        reply = _put(
            client,
            routes.join(origin_url, routes.manifest_path(version)),
            content=signed.model_dump_json().encode(),
            what="manifest",
            attempts=attempts_per_shard,
            headers={"Content-Type": "application/json"},
        )
        # The origin links the shards an earlier version holds unchanged and lists the rest.
        missing = _missing(reply)
        deltas = {d.delta.name for d in signed.manifest.deltas}
        jobs = [
            (f, s)
            for f in served_files(signed.manifest)
            for s in f.shards
            if missing is None or (f.name, s.index) in missing
        ]
        # Deltas whole before the full files start, as relays pull them: the clients rebuilding
        # from a delta wait for nothing else.
        for phase in (
            [j for j in jobs if j[0].name in deltas],
            [j for j in jobs if j[0].name not in deltas],
        ):
            with ThreadPoolExecutor(max_workers=max(1, max_workers)) as ex:
                # list() re-raises the first upload failure here.
                list(
                    ex.map(
                        lambda j: _put_shard(
                            client,
                            origin_url,
                            sources[j[0].name],
                            version,
                            *j,
                            attempts=attempts_per_shard,
                        ),
                        phase,
                    )
                )
        listing = RelayVersions.model_validate_json(
            client.get(routes.join(origin_url, routes.VERSIONS)).raise_for_status().content
        )
        if version not in listing.versions:
            raise PublishError(f"origin did not list version {version} after the upload")
        return signed
    finally:
        if http is None:
            client.close()


def _already_complete(
    http: httpx.Client,
    origin_url: str,
    model_hash: str,
    version: int,
    account: LocalAccount,
    timeout: float,
) -> SignedManifest | None:
    """The origin's own signed manifest when it holds `version` complete with our files; a
    different model under the same version is a conflict no retry can mend."""
    if version not in list_versions(origin_url, timeout_s=timeout, http=http).versions:
        return None
    held = fetch_manifest([origin_url], version, account.address, timeout, http=http)
    if held.manifest.model_hash != model_hash:
        raise PublishError(f"origin holds another model as version {version}")
    return held


def _missing(reply: httpx.Response) -> set[tuple[str, int]] | None:
    """The (file, shard index) pairs the origin still lacks, from its manifest reply; None
    (upload everything) when it does not say."""
    try:
        listed = reply.json().get("missing")
        return None if listed is None else {(str(n), int(i)) for n, i in listed}
    except (ValueError, TypeError, AttributeError):
        return None


def _put_shard(
    http: httpx.Client,
    origin: str,
    source: Path,
    version: int,
    entry: FileEntry,
    shard: ShardInfo,
    *,
    attempts: int,
) -> None:
    url = routes.join(origin, routes.shard_path(version, entry.name, shard.index))
    _put(
        http,
        url,
        what=f"{entry.name}#{shard.index}",
        attempts=attempts,
        # A fresh generator per attempt; the explicit length lets the origin refuse early (413).
        body=lambda: iter_shard_bytes(source, shard),
        headers={"Content-Type": "application/octet-stream", "Content-Length": str(shard.size)},
    )


def _put(
    http: httpx.Client,
    url: str,
    *,
    what: str,
    attempts: int,
    headers: dict[str, str],
    content: bytes | None = None,
    body: Callable[[], Iterator[bytes]] | None = None,
) -> httpx.Response:
    last = ""
    for attempt in range(max(1, attempts)):
        try:
            resp = http.put(url, content=content if body is None else body(), headers=headers)
        except httpx.TransportError as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if resp.status_code < 300:
                return resp
            if resp.status_code < 500:  # the origin judged the request: retrying won't help
                raise PublishError(f"origin refused {what}: HTTP {resp.status_code} {resp.text}")
            last = f"HTTP {resp.status_code}"
        if attempt + 1 < attempts:
            time.sleep(RETRY_PAUSE_S * (attempt + 1))
    raise PublishError(f"upload of {what} failed after {attempts} attempts: {last}")
