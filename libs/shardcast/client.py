"""Downloading a policy version through untrusted relays, verifying everything on the way."""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx
from pydantic import ValidationError

from prime_swarm.protocol.manifest_signing import ManifestError, verify_manifest
from prime_swarm.protocol.messages import (
    FileDelta,
    FileEntry,
    Manifest,
    RelayVersions,
    ShardInfo,
    SignedManifest,
)

from . import delta, routes
from .errors import NotAvailableError, ShardHashError
from .fetch import Cancelled, ShardTask, fetch_all
from .manifest import READ_CHUNK, check_layout, delta_for
from .output import OutputFile
from .relays import RelayPool, as_pool
from .transport import FetchOptions, ShardTransport, tls_context
from .verify import ShardVerifier

log = logging.getLogger("shardcast.client")
VersionSpec = int | Literal["latest"]
Progress = Callable[[int, int], None]  # (bytes done, bytes total); called from worker threads
MAX_MANIFEST_BYTES = 64 * 1024 * 1024


def make_http_client(timeout_s: float, max_connections: int = 32) -> httpx.Client:
    """A client whose every request has a timeout (connect, read, write and pool wait)."""
    return httpx.Client(
        verify=tls_context(),
        timeout=httpx.Timeout(timeout_s),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=32),
        follow_redirects=False,
    )


def list_versions(
    relay: str,
    *,
    timeout_s: float = 10.0,
    http: httpx.Client | None = None,
    partial: bool = False,
) -> RelayVersions:
    """Complete versions of a relay, or (`partial`) the versions it is still receiving."""
    path = routes.PARTIAL if partial else routes.VERSIONS
    try:
        body = _get_capped(http, routes.join(relay, path), timeout_s, 1024 * 1024)
    except _NotFound:
        if partial:  # a relay without cut-through
            return RelayVersions(versions=[], latest=None)
        raise
    return RelayVersions.model_validate_json(body)


def wait_for_version(
    relay: str, version: int, *, timeout_s: float = 30.0, poll_s: float = 0.2
) -> RelayVersions:
    """Block until `relay` lists `version` as complete; TimeoutError otherwise."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    with make_http_client(min(5.0, timeout_s)) as http:
        while True:
            try:
                listing = list_versions(relay, http=http)
                if version in listing.versions:
                    return listing
                last = listing
            except (httpx.HTTPError, ValidationError) as exc:
                last = exc
            if time.monotonic() + poll_s > deadline:
                raise TimeoutError(
                    f"{relay} did not list version {version} in {timeout_s}s: {last}"
                )
            time.sleep(poll_s)


def wait_for_manifest(
    relays: Iterable[str] | RelayPool,
    version: int,
    trusted_trainer: str,
    *,
    wait_s: float,
    timeout_s: float = 10.0,
    poll_s: float = 0.1,
    http: httpx.Client | None = None,
) -> SignedManifest:
    """Poll until some relay serves the signed manifest of `version` (it may still be arriving)."""
    pool = as_pool(relays)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return fetch_manifest(pool, version, trusted_trainer, timeout_s, http=http)
        except NotAvailableError:
            if time.monotonic() + poll_s > deadline:
                raise
        time.sleep(poll_s)


def fetch_manifest(
    relays: Iterable[str] | RelayPool,
    version: VersionSpec,
    trusted_trainer: str,
    timeout: float = 10.0,
    *,
    http: httpx.Client | None = None,
) -> SignedManifest:
    """Return a manifest signed by `trusted_trainer`, trying relays in turn.

    For "latest" every relay's listing is asked and the highest claimed version that some relay
    can back with a valid signature wins, so one lagging or lying relay cannot pin an old version.
    """
    pool = as_pool(relays)
    if version != "latest":
        return _fetch_verified(pool, int(version), trusted_trainer, timeout, http)
    claims: set[int] = set()
    for relay in pool.candidates():
        try:
            listing = list_versions(relay, timeout_s=timeout, http=http)
        except (httpx.HTTPError, ValidationError) as exc:
            pool.record_error(relay, f"listing: {type(exc).__name__}: {exc}")
            continue
        if listing.latest is not None:
            claims.add(listing.latest)
    problems = []
    for v in sorted(claims, reverse=True):
        try:
            return _fetch_verified(pool, v, trusted_trainer, timeout, http)
        except NotAvailableError as exc:
            problems.append(str(exc))
    raise NotAvailableError(
        f"no relay offers a valid latest version ({'; '.join(problems) or 'none listed any'})"
    )


def _fetch_verified(
    pool: RelayPool, version: int, trusted: str, timeout: float, http: httpx.Client | None
) -> SignedManifest:
    reasons = []
    for relay in pool.candidates():
        url = routes.join(relay, routes.manifest_path(version))
        try:
            body = _get_capped(http, url, timeout, MAX_MANIFEST_BYTES)
        except _NotFound:
            pool.record_miss(relay, "manifest not held")
            reasons.append(f"{relay}: not held")
            continue
        except httpx.HTTPError as exc:
            pool.record_error(relay, f"manifest: {type(exc).__name__}: {exc}")
            reasons.append(f"{relay}: {type(exc).__name__}")
            continue
        try:
            signed = SignedManifest.model_validate_json(body)
            verify_manifest(signed, trusted)
            if signed.manifest.version != version:
                raise ManifestError(f"asked for version {version}, got {signed.manifest.version}")
        except (ValidationError, ManifestError) as exc:
            # A relay cannot produce a valid signature, so a bad manifest is its doing.
            reason = f"bad manifest for version {version}: {str(exc).splitlines()[0]}"
            pool.demote(relay, reason)
            reasons.append(f"{relay}: {reason}")
            continue
        check_layout(signed.manifest)  # signed but unusable: the trainer's bug, abort loudly
        return signed
    raise NotAvailableError(f"manifest of version {version}: {'; '.join(reasons)}")


class _NotFound(httpx.HTTPError):
    pass


def _get_capped(http: httpx.Client | None, url: str, timeout: float, cap: int) -> bytes:
    """GET a small document without letting a hostile server make us buffer gigabytes."""
    client = http or make_http_client(timeout)
    try:
        with client.stream("GET", url, timeout=timeout) as resp:
            if resp.status_code == 404:
                raise _NotFound(f"{url}: 404")
            resp.raise_for_status()
            parts, size = [], 0
            for chunk in resp.iter_bytes():
                size += len(chunk)
                if size > cap:
                    raise httpx.DecodingError(f"{url}: response larger than {cap} bytes")
                parts.append(chunk)
            return b"".join(parts)
    finally:
        if http is None:
            client.close()


class _RegionSink:
    """Writes a shard straight into its place in the output file.

    Bytes of a failed attempt may stay behind, but the retry overwrites exactly the same region
    (the verifier stops any write past the shard's end), and the file hash is checked at the end.
    `OutputFile` writes block-aligned runs past the page cache (`output.py`).
    """

    def __init__(self, out: OutputFile, shard: ShardInfo) -> None:
        self._out = out
        self._shard = shard
        self._pos = shard.offset
        self._verifier = ShardVerifier(shard)

    @property
    def received(self) -> int:
        return self._verifier.received

    def reset(self) -> None:
        self._pos = self._shard.offset
        self._verifier = ShardVerifier(self._shard)

    def write(self, chunk: bytes) -> None:
        self._verifier.update(chunk)
        self._pos = self._out.write_at(memoryview(chunk), self._pos)

    def commit(self) -> None:
        self._verifier.finish()

    def abort(self) -> None:
        pass


@dataclass(frozen=True)
class HeldFiles:
    """A version installed earlier, its files verified against its signed manifest. A new
    version's file with the same name, size and sha256 is linked from here instead of fetched:
    between RL steps only the weights change, and the config and tokenizer files would cost
    every client a request per file and version."""

    directory: Path
    manifest: Manifest

    def source_of(self, f: FileEntry) -> Path | None:
        return self.file_with(f.name, f.size, f.sha256)

    def file_with(self, name: str, size: int, sha256: str) -> Path | None:
        """The held file of that name, size and hash, if it is still on disk."""
        for old in self.manifest.files:
            if (old.name, old.size, old.sha256) == (name, size, sha256):
                path = self.directory / name
                try:
                    return path if path.stat().st_size == size else None
                except OSError:
                    return None
        return None


def download_version(
    relays: Iterable[str] | RelayPool,
    version: VersionSpec,
    out_dir: str | Path,
    trusted_trainer: str,
    *,
    timeout_s: float = 10.0,
    attempts_per_shard: int | None = None,
    deadline_s: float | None = None,
    max_workers: int = 8,
    progress: Progress | None = None,
    manifest: SignedManifest | None = None,
    overwrite: bool = False,
    verify_files: bool = False,
    http: httpx.Client | None = None,
    wait_s: float | None = None,
    held: HeldFiles | None = None,
    stop: threading.Event | None = None,
) -> Path:
    """Download, verify and atomically install a policy version as a model directory.

    `relays` may be a RelayPool to keep relay health across calls and read `pool.demoted`
    afterwards. `timeout_s` bounds each request; `attempts_per_shard` (default: twice the number
    of relays, at least 3) and `deadline_s` (whole download) bound the retries; each transfer
    also has its own deadline, and a transfer cut off mid-shard resumes with a Range request.
    Relays are asked to hold a request up to `wait_s` (default: half of `timeout_s`) for a shard
    they are still receiving, so a version can be fetched while it travels down the tree.

    Every shard is verified against the signed manifest as it arrives and `check_layout` has
    checked that the shards tile each file exactly, so the installed files are exactly the signed
    ones; `verify_files=True` re-hashes whole files on top (a second sha256 pass, for audits).
    Files the signed manifest shares with `held` (same name, size and sha256) are linked from
    there rather than fetched. Setting `stop` cancels the download between transfers (raising
    `Cancelled`, nothing installed), so a process can end without a fetch still running.
    `http` (httpx) carries the manifest; shard bodies always travel on a `ShardTransport`.
    """
    if wait_s is None:
        wait_s = min(routes.MAX_WAIT_S, timeout_s / 2)
    pool = as_pool(relays)
    out_dir = Path(out_dir)
    opts = FetchOptions(
        timeout_s=timeout_s,
        wait_s=wait_s,
        attempts_per_shard=attempts_per_shard,
        deadline=time.monotonic() + deadline_s if deadline_s is not None else None,
        max_workers=max_workers,
    )
    own_http = http is None
    client = http or make_http_client(timeout_s)
    transport = ShardTransport(timeout_s, max_idle_per_host=max(8, max_workers))
    try:
        if manifest is None:
            signed = fetch_manifest(pool, version, trusted_trainer, timeout_s, http=client)
        else:
            verify_manifest(manifest, trusted_trainer)
            check_layout(manifest.manifest)
            signed = manifest
        m = signed.manifest
        if version != "latest" and m.version != version:
            raise ValueError(f"manifest is for version {m.version}, not {version}")
        if out_dir.exists() and not overwrite:
            raise FileExistsError(f"{out_dir} exists (pass overwrite=True to replace it)")
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.partial-"))
        try:
            _download_into(transport, pool, signed, staging, opts, progress, held, stop)
            if verify_files:
                _verify_files(signed, staging)
            _install(staging, out_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return out_dir
    finally:
        if own_http:
            client.close()
        transport.close()


def _download_into(
    transport: ShardTransport,
    pool: RelayPool,
    signed: SignedManifest,
    staging: Path,
    opts: FetchOptions,
    progress: Progress | None,
    held: HeldFiles | None = None,
    stop: threading.Event | None = None,
) -> None:
    m = signed.manifest
    total = sum(f.size for f in m.files)
    done = 0
    lock = threading.Lock()

    def shard_done(task: ShardTask) -> None:
        nonlocal done
        with lock:
            done += task.shard.size
            now = done
        if progress is not None:
            progress(now, total)

    outs: dict[str, OutputFile] = {}

    def fetch(files: list[FileEntry]) -> None:
        tasks = []
        for f in files:
            # Sparse until written: shards may land in any order.
            outs[f.name] = OutputFile.create(staging / f.name, f.size)
            tasks.extend(ShardTask(f, s) for s in f.shards)
        fetch_all(
            transport,
            pool,
            m.version,
            tasks,
            lambda t: _RegionSink(outs[t.file.name], t.shard),
            opts,
            on_shard_done=shard_done,
            stop=stop,
        )

    try:
        whole: list[FileEntry] = []
        rebuilds: list[tuple[FileEntry, FileDelta, Path]] = []
        for f in m.files:
            if _link_held(held, f, staging):
                done += f.size
                continue
            d = delta_for(m, f.name)
            parent = held.file_with(f.name, f.size, d.parent_sha256) if held and d else None
            if d is not None and parent is not None:
                rebuilds.append((f, d, parent))
                total += d.delta.size - f.size  # the delta travels instead of the file
            else:
                whole.append(f)
        fetch(whole + [d.delta for _, d, _ in rebuilds])
        if stop is not None and stop.is_set():
            raise Cancelled("download cancelled")  # before the rebuilds, the CPU-bound part
        failed = [f for f, d, parent in rebuilds if not _rebuild(f, d, parent, staging)]
        if failed:  # a delta that does not rebuild the signed file: fetch the file itself
            total += sum(f.size for f in failed)
            fetch(failed)
    finally:
        for out in outs.values():
            out.close()
    if progress is not None and total == 0:
        progress(0, 0)


def _rebuild(f: FileEntry, d: FileDelta, parent: Path, staging: Path) -> bool:
    """Write `f` into `staging` from the held parent file and the fetched (shard-verified)
    delta, keeping it only if it hashes to the signed `f.sha256`; the delta file goes."""
    delta_path = staging / d.delta.name
    target = staging / f.name
    try:
        changes = delta.parse(delta_path.read_bytes(), f.size)
        with open(parent, "rb", buffering=0) as src:
            if os.fstat(src.fileno()).st_size != f.size:
                raise delta.DeltaError(f"{f.name}: the held parent file has another size")
            out = OutputFile.create(target, f.size)
            try:
                digest = _patch_through(src.fileno(), out, changes, f.size)
            finally:
                out.close()
        if digest != f.sha256:
            raise delta.DeltaError(f"{f.name}: rebuilt file differs from the signed one")
        return True
    except (delta.DeltaError, OSError) as exc:
        log.warning("delta not used, fetching the file: %s", exc)
        target.unlink(missing_ok=True)
        return False
    finally:
        delta_path.unlink(missing_ok=True)


REBUILD_PIECE = delta.BLOCK_BYTES
"""One block of the delta's order (a delta patches whole blocks), and page-aligned (each piece is
one direct write)."""


def _patch_through(
    src: int,
    out: OutputFile,
    changes: delta.Changes,
    size: int,
    piece: int = REBUILD_PIECE,
    workers: int | None = None,
) -> str:
    """Stream the parent through a few reused, page-aligned buffers: read a piece and patch it
    (on `workers` threads, pieces ahead of the writer), then hash it and write it in order
    (`OutputFile`: direct). sha256 is sequential, so the hash runs on one core while the patches,
    which dominate, spread over the rest. A rebuild touches no memory of the file's size; first
    touches of fresh memory, in a mapping or the page cache, were most of its cost."""
    workers = workers or len(os.sched_getaffinity(0))
    depth = 2 * workers  # pieces in flight: enough to keep every thread busy
    spare = [mmap.mmap(-1, piece) for _ in range(depth)]
    digest = hashlib.sha256()

    def patched(buf: mmap.mmap, offset: int, n: int) -> None:
        view = memoryview(buf)
        try:
            if os.preadv(src, [view[:n]], offset) != n:
                raise delta.DeltaError("the held parent file is short")
            # Read once, and the new version replaces it: its cached pages go back now, to be
            # reused by the next piece instead of fresh ones.
            _drop_cached(src, offset, n)
            if n % 2:  # only the last piece: pad to a whole word
                view[n] = 0
            changes.patch(view[: n + n % 2], offset)
        finally:
            view.release()

    def finish(job: tuple[mmap.mmap, int, int, Future[None]]) -> None:
        buf, offset, n, done = job
        try:
            done.result()
            with memoryview(buf) as view:
                digest.update(view[:n])
                out.write_at(view[:n], offset)
        finally:
            spare.append(buf)

    jobs: deque[tuple[mmap.mmap, int, int, Future[None]]] = deque()
    try:
        with ThreadPoolExecutor(workers) as pool:
            try:
                for offset in range(0, size, piece):
                    if not spare:
                        finish(jobs.popleft())
                    buf, n = spare.pop(), min(piece, size - offset)
                    jobs.append((buf, offset, n, pool.submit(patched, buf, offset, n)))
                while jobs:
                    finish(jobs.popleft())
            finally:
                for job in jobs:  # a failure: let the pieces in flight end before unmapping
                    job[3].cancel()
                    spare.append(job[0])
    finally:
        for buf in spare:
            buf.close()
    return digest.hexdigest()


def _drop_cached(fd: int, offset: int, length: int) -> None:
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def _link_held(held: HeldFiles | None, f: FileEntry, staging: Path) -> bool:
    """Install `f` from the held version (a hard link, a copy across file systems); False
    when it must be fetched, also when the held copy vanished meanwhile (evicted)."""
    source = held.source_of(f) if held is not None else None
    if source is None:
        return False
    try:
        try:
            os.link(source, staging / f.name)
        except OSError:
            shutil.copyfile(source, staging / f.name)
    except OSError:
        (staging / f.name).unlink(missing_ok=True)
        return False
    return True


def _verify_files(signed: SignedManifest, staging: Path) -> None:
    # Every shard was verified; this catches a manifest whose shard table and file hash disagree.
    for f in signed.manifest.files:
        h = hashlib.sha256()
        with open(staging / f.name, "rb") as fh:
            while data := fh.read(READ_CHUNK * 4):
                h.update(data)
        if h.hexdigest() != f.sha256:
            raise ShardHashError(f"{f.name}: file sha256 differs from the signed manifest")


def _install(staging: Path, out_dir: Path) -> None:
    if not out_dir.exists():
        os.rename(staging, out_dir)
        return
    # Replace: move the old one aside first so out_dir is never a mix of two versions.
    old = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.old-"))
    os.rename(out_dir, old / "x")
    os.rename(staging, out_dir)
    shutil.rmtree(old, ignore_errors=True)
