"""Building a policy version's manifest from a model directory, and checking its file table."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

from prime_swarm.protocol.manifest_signing import model_hash
from prime_swarm.protocol.messages import FileDelta, FileEntry, Manifest, ShardInfo

from .errors import ManifestLayoutError, UnsafeNameError

DEFAULT_SHARD_SIZE = 16 * 1024 * 1024
# Read granularity while hashing: large enough for throughput, small enough to bound memory.
READ_CHUNK = 1024 * 1024


def check_file_name(name: str) -> str:
    """Refuse names that would resolve outside a directory.

    The protocol's pattern already forbids separators, but "." and ".." match it.
    """
    if name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise UnsafeNameError(f"unsafe file name {name!r}")
    return name


def served_files(manifest: Manifest) -> list[FileEntry]:
    """Every file relays hold for a version, deltas first: uploads and relay pulls go in this
    order, so a client rebuilding from a delta is not kept waiting behind the full file."""
    return [*(d.delta for d in manifest.deltas), *manifest.files]


def delta_for(manifest: Manifest, name: str) -> FileDelta | None:
    return next((d for d in manifest.deltas if d.name == name), None)


def check_layout(manifest: Manifest) -> None:
    """Checks that signature verification does not cover: the files can be written side by side."""
    model_files = {f.name for f in manifest.files}
    for d in manifest.deltas:
        if d.name not in model_files or manifest.parent_version is None:
            raise ManifestLayoutError(f"delta for {d.name!r} rebuilds no file of a child version")
    if len({d.name for d in manifest.deltas}) != len(manifest.deltas):
        raise ManifestLayoutError("a file has two deltas")
    seen: set[str] = set()
    for f in served_files(manifest):
        try:
            check_file_name(f.name)
        except UnsafeNameError as exc:
            raise ManifestLayoutError(str(exc)) from exc
        if f.name in seen:
            raise ManifestLayoutError(f"file {f.name!r} is listed twice")
        seen.add(f.name)
        # The shards must tile the file exactly: then verified shards make a verified file.
        offset = 0
        for i, s in enumerate(f.shards):
            if s.index != i or s.offset != offset or s.size == 0:
                raise ManifestLayoutError(f"file {f.name!r}: shard {i} breaks the tiling")
            offset += s.size
        if offset != f.size:
            raise ManifestLayoutError(f"file {f.name!r}: shards cover {offset} of {f.size} bytes")


def find_file(manifest: Manifest, name: str) -> FileEntry | None:
    return next((f for f in served_files(manifest) if f.name == name), None)


def iter_shard_bytes(path: Path, shard: ShardInfo, chunk: int = READ_CHUNK) -> Iterator[bytes]:
    """Stream one shard's bytes out of a whole file."""
    with open(path, "rb") as fh:
        fh.seek(shard.offset)
        left = shard.size
        while left > 0:
            data = fh.read(min(chunk, left))
            if not data:
                raise ManifestLayoutError(f"{path} is shorter than its manifest says")
            left -= len(data)
            yield data


def hash_file(path: Path, name: str, shard_size: int) -> FileEntry:
    """sha256 per shard and for the whole file in one streaming pass."""
    whole = hashlib.sha256()
    shards: list[ShardInfo] = []
    offset = 0
    with open(path, "rb") as fh:
        while True:
            part = hashlib.sha256()
            size = 0
            while size < shard_size:
                data = fh.read(min(READ_CHUNK, shard_size - size))
                if not data:
                    break
                part.update(data)
                whole.update(data)
                size += len(data)
            if size == 0:
                break
            shards.append(
                ShardInfo(index=len(shards), offset=offset, size=size, sha256=part.hexdigest())
            )
            offset += size
            if size < shard_size:
                break
    # An empty file has no shards: verify_manifest accepts that and the downloader creates it.
    return FileEntry(name=name, size=offset, sha256=whole.hexdigest(), shards=shards)


def build_manifest(
    model_dir: str | Path,
    version: int,
    parent_version: int | None,
    shard_size: int,
    trainer_address: str,
) -> Manifest:
    """Hash every file at the top of `model_dir` (HF model directories are flat).

    Symlinks are followed because Hugging Face cache snapshots are links into a blob store.
    """
    model_dir = Path(model_dir)
    if shard_size <= 0:
        raise ValueError("shard_size must be positive")
    paths = sorted(p for p in model_dir.iterdir() if p.is_file())
    if not paths:
        raise ValueError(f"{model_dir} holds no files to publish")
    files = [hash_file(p, check_file_name(p.name), shard_size) for p in paths]
    return Manifest(
        version=version,
        parent_version=parent_version,
        shard_size=shard_size,
        files=files,
        model_hash=model_hash(files),
        trainer=trainer_address,
    )
