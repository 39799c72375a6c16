"""Off the training path: checkpoint each version, acknowledge what it consumed, publish it.

The step loop hands over a snapshot (weights and optimizer state copied at the end of the step)
and goes on training; this one thread does, per version, in this order:

1. write the checkpoint atomically (weights, optimizer, RNG, the submission ids trained);
2. mark those ids trained and XACK their stream entries in one Redis transaction;
3. publish the newest saved version to the origin and announce it.

(1) before (2) is the exactly-once argument: an entry is acknowledged only after the weights
that learned from it are durable, and a restart re-adds every saved version's ids to the
trained set, so a reclaimed entry is either skipped (its step was saved) or trained once (it
was not). Publishing (3) coalesces: when uploads are slower than steps, intermediate versions
are saved but not shipped, and the workers jump straight to the newest one.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
import torch

from prime_swarm.libs.rl.checkpoint import TrainerState
from prime_swarm.protocol import streams

from . import metrics

log = logging.getLogger("trainer")
TRAINED = "trainer:trained_submissions"
# Audit trail, read by `prime-swarm chaos`: each saved step's trained ids (written once per
# step, also when a restart re-adds a saved step's ids), and every id dropped untrained, with
# why. A submission in two steps' lists was trained twice.
TRAINED_BY_STEP = "trainer:trained_by_step"
DROPPED = "trainer:dropped_submissions"


@dataclass
class Snapshot:
    state: TrainerState
    weights: dict[str, torch.Tensor]
    entry_ids: list[str] = field(default_factory=list)
    created: float = field(default_factory=time.monotonic)


class Persister:
    def __init__(
        self,
        r: redis.Redis,
        save: Callable[[Snapshot], None],
        publish: Callable[[int], None],
        start_version: int,
        max_pending: int = 2,
    ) -> None:
        self.r, self._save, self._publish = r, save, publish
        # Bounded: a trainer that outruns its disk waits here instead of piling up snapshots.
        self._q: queue.Queue[Snapshot | None] = queue.Queue(maxsize=max_pending)
        # The start version is saved and published synchronously before training begins.
        self._saved = self._published = start_version
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="trainer-persist", daemon=True)
        self._thread.start()

    def submit(self, snap: Snapshot) -> float:
        """Queue a version; returns the seconds spent waiting for room (0 unless I/O lags)."""
        self.raise_if_failed()
        t0 = time.monotonic()
        self._q.put(snap)
        return time.monotonic() - t0

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError("checkpoint/publish thread failed") from self._error

    def drain(self, timeout_s: float = 300.0) -> None:
        """Wait until every queued version is saved, acknowledged and the newest published."""
        self._q.put(None)
        self._thread.join(timeout_s)
        self.raise_if_failed()

    @property
    def published(self) -> int:
        return self._published

    def _run(self) -> None:
        try:
            while True:
                snap = self._q.get()
                if snap is None:
                    self._publish_latest()
                    return
                t0 = time.monotonic()
                self._save(snap)
                self._acknowledge(snap)
                self._saved = snap.state.step
                metrics.SAVE_SECONDS.observe(time.monotonic() - t0)
                if self._q.empty():  # coalesce: only the newest saved version is shipped
                    self._publish_latest()
        except BaseException as exc:  # surfaced to the step loop at its next submit
            log.exception("checkpoint/publish failed")
            self._error = exc

    def _acknowledge(self, snap: Snapshot) -> None:
        pipe = self.r.pipeline(transaction=True)
        if snap.state.trained:
            pipe.sadd(TRAINED, *snap.state.trained)
            pipe.hsetnx(TRAINED_BY_STEP, str(snap.state.step), ",".join(snap.state.trained))
        if snap.entry_ids:
            pipe.xack(streams.ROLLOUTS_VERIFIED, streams.TRAINER_GROUP, *snap.entry_ids)
        pipe.execute()

    def _publish_latest(self) -> None:
        if self._saved > self._published:
            t0 = time.monotonic()
            self._publish(self._saved)
            self._published = self._saved
            metrics.PUBLISH_SECONDS.observe(time.monotonic() - t0)
