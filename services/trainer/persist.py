"""Off the training path: checkpoint each version, acknowledge what it consumed, publish it.

The step loop hands over a snapshot (weights and optimizer state copied at the end of the step)
and goes on training; this one thread does, per version, in this order:

1. write the checkpoint atomically (weights, optimizer, RNG, the submission ids trained);
2. mark those ids trained and XACK their stream entries in one Redis transaction (the
   acknowledged entries are trimmed later, libs/streams/retention.py);
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
from prime_swarm.libs.streams.replication import Replication, ReplicaWait
from prime_swarm.libs.streams.retention import Retention
from prime_swarm.protocol import streams
from prime_swarm.protocol.trainer_records import TRAINED, TRAINED_BY_STEP

from . import metrics

log = logging.getLogger("trainer")
# The trained ids of a step and the acknowledgement of its entries, in one atomic write (the
# script and the WAIT after it go on one connection: WAIT covers that connection's writes).
#   KEYS: trained set, trained-by-step hash, verified stream
#   ARGV: trainer group, step, number of trained ids, trained ids..., entry ids...
_ACKNOWLEDGE = """
local n = tonumber(ARGV[3])
if n > 0 then
  redis.call('SADD', KEYS[1], unpack(ARGV, 4, 3 + n))
  redis.call('HSETNX', KEYS[2], ARGV[2], table.concat(ARGV, ',', 4, 3 + n))
end
if #ARGV > 3 + n then
  redis.call('XACK', KEYS[3], ARGV[1], unpack(ARGV, 4 + n))
end
return n
"""
ACK_ATTEMPTS = 5


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
        replica_wait: ReplicaWait | None = None,
    ) -> None:
        self.r, self._save, self._publish = r, save, publish
        self._ack_script = r.register_script(_ACKNOWLEDGE)
        self.replica_wait = replica_wait or ReplicaWait(enabled=False)
        self.retention = Retention(r, (streams.ROLLOUTS_VERIFIED,))
        # Bounded: a trainer that outruns its disk waits here instead of piling up snapshots.
        self._q: queue.Queue[Snapshot | None] = queue.Queue(maxsize=max_pending)
        # The start version is saved and published synchronously before training begins.
        self._saved = self._published = start_version
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="trainer-persist", daemon=True)
        self._thread.start()

    @property
    def saved_step(self) -> int:
        """The newest version saved and acknowledged: a group collected at a step below it is
        durable (its entry acknowledged, its id in the trained set)."""
        return self._saved

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
                self.retention.maybe_trim()
                self._saved = snap.state.step
                metrics.SAVE_SECONDS.observe(time.monotonic() - t0)
                if self._q.empty():  # coalesce: only the newest saved version is shipped
                    self._publish_latest()
        except BaseException as exc:  # surfaced to the step loop at its next submit
            log.exception("checkpoint/publish failed")
            self._error = exc

    def _acknowledge(self, snap: Snapshot) -> None:
        """Record the step's trained ids and acknowledge its entries, all or nothing; with
        replicas, until one holds them (a failover that lost them would have the entries
        delivered again, and the trained set would not know them)."""
        for attempt in range(ACK_ATTEMPTS):
            try:
                replication = self._ack_once(snap)
            except redis.exceptions.NoScriptError:
                # The pipeline checked its script on one node and a retry ran it on another
                # (a failover in between: scripts are not replicated). The next try loads it.
                continue
            if replication is None or replication.acknowledged:
                return
            metrics.UNREPLICATED_ACKS.inc()
            log.warning(
                "step %d acknowledged but not yet replicated (%s, try %d)",
                snap.state.step, replication, attempt + 1,
            )  # fmt: skip
        # The step is saved on disk (a restart re-adds its ids) and the trainer remembers what
        # it took (loop.py `_taken`): going on is safe, only the books could miss the step.

    def _ack_once(self, snap: Snapshot) -> Replication | None:
        """The script, then WAIT on the same connection; None: no replicas to wait for."""
        with self.r.pipeline(transaction=False) as pipe:
            self._ack_script(
                keys=[TRAINED, TRAINED_BY_STEP, streams.ROLLOUTS_VERIFIED],
                args=[
                    streams.TRAINER_GROUP,
                    snap.state.step,
                    len(snap.state.trained),
                    *snap.state.trained,
                    *snap.entry_ids,
                ],
                client=pipe,
            )
            waits = self.replica_wait.queue(pipe)
            _, *replicated = pipe.execute()
        return self.replica_wait.verdict(self.r, *replicated) if waits else None

    def _publish_latest(self) -> None:
        if self._saved > self._published:
            t0 = time.monotonic()
            self._publish(self._saved)
            self._published = self._saved
            metrics.PUBLISH_SECONDS.observe(time.monotonic() - t0)
