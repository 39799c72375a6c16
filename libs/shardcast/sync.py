"""A relay's pull step: bring the newest versions of its parents into its store.

One call of `ParentSync.poll_once()` is one poll; the service owns the loop and the schedule.
With cut-through (the default) a relay starts on a version as soon as a parent holds its signed
manifest, and each shard it verifies is served at once, so a version flows down a tree of any
depth without waiting for each level to complete.
"""

from __future__ import annotations

import logging
import threading
import time

import httpx
from pydantic import ValidationError

from . import routes
from .client import fetch_manifest, list_versions, make_http_client
from .errors import NotAvailableError, ShardcastError
from .fetch import ShardTask, fetch_all
from .relays import RelayPool
from .store import VersionConflictError, VersionStore
from .transport import FetchOptions, ShardTransport

log = logging.getLogger(__name__)


class ParentSync:
    def __init__(
        self,
        store: VersionStore,
        parents: RelayPool,
        trusted_trainer: str,
        *,
        keep: int = 4,
        timeout_s: float = 10.0,
        max_workers: int = 8,
        attempts_per_shard: int | None = None,
        version_deadline_s: float | None = 600.0,
        stop: threading.Event | None = None,
        cut_through: bool = True,
    ) -> None:
        self.store = store
        self.parents = parents
        self.trusted_trainer = trusted_trainer
        self.keep = keep
        self.timeout_s = timeout_s
        self.max_workers = max_workers
        self.attempts_per_shard = attempts_per_shard
        self.version_deadline_s = version_deadline_s
        self.stop = stop or threading.Event()
        # Pull versions that parents are still receiving, shard by shard as they verify them.
        self.cut_through = cut_through
        self.wait_s = min(routes.MAX_WAIT_S, max(1.0, timeout_s / 2)) if cut_through else 0.0
        self.http = make_http_client(timeout_s)  # listings and manifests
        self.transport = ShardTransport(timeout_s, max_idle_per_host=max(8, max_workers))

    def close(self) -> None:
        self.http.close()
        self.transport.close()

    def upstream_versions(self) -> set[int]:
        """Versions some parent lists: complete ones, and (cut-through) ones still arriving."""
        found: set[int] = set()
        for parent in self.parents.candidates():
            try:
                found.update(
                    list_versions(parent, timeout_s=self.timeout_s, http=self.http).versions
                )
                if self.cut_through:
                    found.update(
                        list_versions(
                            parent, timeout_s=self.timeout_s, http=self.http, partial=True
                        ).versions
                    )
            except (httpx.HTTPError, ValidationError) as exc:
                self.parents.record_error(parent, f"listing: {type(exc).__name__}: {exc}")
        return found

    def wanted(self, upstream: set[int]) -> list[int]:
        """Newest first: the versions we would keep that we do not hold complete yet."""
        window = sorted(upstream | set(self.store.versions()), reverse=True)[: self.keep]
        return [v for v in window if v in upstream and not self.store.is_complete(v)]

    def poll_once(self) -> list[int]:
        """Pull what is missing; return the versions completed by this call."""
        completed = []
        for version in self.wanted(self.upstream_versions()):
            if self.stop.is_set():
                break
            try:
                if self.pull_version(version):
                    completed.append(version)
            except (NotAvailableError, VersionConflictError, ShardcastError) as exc:
                log.warning(
                    "pull of version %s failed: %s", version, exc, extra={"version": version}
                )
        if completed:
            evicted = self.store.evict(self.keep)
            if evicted:
                log.info("evicted versions %s", evicted, extra={"evicted": evicted})
        return completed

    def pull_version(self, version: int) -> bool:
        started = time.monotonic()
        signed = fetch_manifest(
            self.parents, version, self.trusted_trainer, self.timeout_s, http=self.http
        )
        self.store.put_manifest(signed)
        missing = [ShardTask(f, s) for f, s in self.store.missing_shards(version)]
        deadline = (
            started + self.version_deadline_s if self.version_deadline_s is not None else None
        )
        opts = FetchOptions(
            timeout_s=self.timeout_s,
            wait_s=self.wait_s,
            attempts_per_shard=self.attempts_per_shard,
            deadline=deadline,
            max_workers=self.max_workers,
        )
        # Deltas first and on their own: pulled side by side with the full files they got a
        # sliver of the link each, and the clients rebuilding from them waited for the full
        # files after all (bench-shardcast's shaped delta run: 8.4 s before, 4.9 s after).
        deltas = {d.delta.name for d in signed.manifest.deltas}
        for phase in (
            [t for t in missing if t.file.name in deltas],
            [t for t in missing if t.file.name not in deltas],
        ):
            fetch_all(
                self.transport,
                self.parents,
                version,
                phase,
                lambda t: self.store.open_shard_writer(version, t.file.name, t.shard.index),
                opts,
                stop=self.stop,
            )
        done = self.store.mark_complete(version)
        if done:
            size = sum(f.size for f in signed.manifest.files)
            elapsed = time.monotonic() - started
            log.info(
                "version %s complete (%d shards fetched, %.1f MB in %.2fs)",
                version,
                len(missing),
                size / 1e6,
                elapsed,
                extra={"version": version, "bytes": size, "seconds": round(elapsed, 3)},
            )
        return done
