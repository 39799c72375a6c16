"""Relay mode's background loop around the library's ParentSync."""

from __future__ import annotations

import logging
import threading

from prime_swarm.libs.shardcast import RelayPool, VersionStore
from prime_swarm.libs.shardcast.relays import EventKind
from prime_swarm.libs.shardcast.sync import ParentSync

from .metrics import RelayMetrics
from .settings import RelaySettings

log = logging.getLogger(__name__)


class Puller:
    """Polls the parents on a daemon thread.

    A thread, not an asyncio task: the sync step is blocking I/O and must never stall serving,
    and a daemon thread cannot hold up shutdown while a request drains its timeout.
    """

    def __init__(self, settings: RelaySettings, store: VersionStore, metrics: RelayMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self._stop = threading.Event()
        pool = RelayPool(settings.parents, on_event=self._on_event)
        self.sync = ParentSync(
            store,
            pool,
            settings.trusted_trainer,
            keep=settings.keep_versions,
            timeout_s=settings.request_timeout_s,
            max_workers=settings.pull_workers,
            stop=self._stop,
        )
        self._thread = threading.Thread(target=self._run, name="relay-puller", daemon=True)

    def _on_event(self, kind: EventKind, url: str, reason: str) -> None:
        if kind == "ok":
            self.metrics.shards_received.inc()
        elif kind in ("error", "demoted"):
            self.metrics.upstream_errors.labels(kind=kind).inc()
            level = logging.WARNING if kind == "demoted" else logging.INFO
            log.log(level, "parent %s: %s", kind, reason, extra={"parent": url, "event": kind})

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
        self.sync.close()

    def _run(self) -> None:
        log.info("pulling from %s", self.settings.parents, extra={"parents": self.settings.parents})
        while not self._stop.is_set():
            try:
                self.sync.poll_once()
            except Exception:  # a bad poll must not kill the relay; the next one may succeed
                log.exception("poll of parents failed")
            self._stop.wait(self.settings.poll_interval_s)
