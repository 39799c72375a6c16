"""Waiting for a write to reach a replica before telling anyone outside Redis about it.

Replication is asynchronous: a primary that dies takes with it whatever its replica had not
received yet (a suffix of its writes: the replica applies the primary's stream in order). Most
of what the pool writes is harmless to lose that way (docs/high-availability.md lists each
write and why); the writes that are acknowledged outward - a submission the worker is told is
in, a step's trained ids - are held until a replica has them (`WAIT`).

With no replica connected there is nothing to wait for: the write is acknowledged as a single
Redis would acknowledge it (on the node the Sentinels call primary, not on a deposed one), and
that loss needs a second failure (the primary lost before any replica came back). A replica
connected but silent past the timeout, or a deposed primary, makes the caller refuse: it
answers "retry", and the retry is idempotent.
"""

from __future__ import annotations

import time
from enum import StrEnum

import redis
import redis.asyncio
import redis.asyncio.client
import redis.client

from .connection import SENTINEL_SCHEME, primary_run_id, primary_run_id_async

# A loopback replica confirms in well under a millisecond; a WAN one in a round trip. A second
# is long enough not to refuse a healthy pool, short enough for a worker's retry.
WAIT_TIMEOUT_MS = 1000


class Replication(StrEnum):
    REPLICATED = "replicated"  # a replica holds the write
    NO_REPLICA = "no_replica"  # none connected: acknowledged as a single Redis would
    LAGGING = "lagging"  # a replica is connected but did not confirm in time: refuse, retry
    # The node is no longer the Sentinels' primary: an old primary back from a cut, writable
    # for the seconds until the Sentinels demote it, and whose writes are then discarded.
    DEPOSED = "deposed"

    @property
    def acknowledged(self) -> bool:
        """Whether the write may be acknowledged outward; otherwise the caller says retry."""
        return self in (Replication.REPLICATED, Replication.NO_REPLICA)


def has_replicas(url: str) -> bool:
    """Whether the deployment runs replicas at all: a Sentinel URL says so. A single Redis
    would answer WAIT only at its timeout, so it is not asked."""
    return url.startswith(SENTINEL_SCHEME + "://")


class ReplicaWait:
    """`WAIT 1` and `INFO` queued behind an acknowledged write, on the same connection (WAIT
    covers the writes of the connection it is sent on, INFO describes the node they went to:
    a pipeline keeps them together), and the verdict.

    With no replica connected, the write is acknowledged only on the node the Sentinels call
    primary (its run id): a client still holding a connection to an old primary back from a
    cut would otherwise have writes acknowledged that the demotion then discards. And for a
    second after that, WAIT is not sent: until a replica is back, each would cost its whole
    timeout."""

    def __init__(self, enabled: bool, timeout_ms: int = WAIT_TIMEOUT_MS) -> None:
        self.enabled, self.timeout_ms = enabled, timeout_ms
        self._alone_until = 0.0

    def queue(self, pipe: redis.client.Pipeline | redis.asyncio.client.Pipeline) -> bool:
        """Queue the WAIT and INFO on `pipe` (after the write); False when not enabled. The
        pipeline's results then end with WAIT's count (0 where it was skipped) and INFO's fields."""
        if not self.enabled:
            return False
        if time.monotonic() >= self._alone_until:
            pipe.execute_command("WAIT", 1, self.timeout_ms)
        else:
            pipe.execute_command("ECHO", "0")  # stands in for WAIT's count: nothing waited
        pipe.execute_command("INFO", "server", "replication")
        return True

    def _judge(self, acked: int, info: dict) -> Replication | None:
        """The verdict, or None when only the Sentinels can tell (no replica connected)."""
        if acked >= 1:
            return Replication.REPLICATED
        if int(info.get("connected_slaves", 0)) > 0:
            self._alone_until = 0.0
            return Replication.LAGGING
        return None

    def _alone(self, run_id: str, primary: str | None) -> Replication:
        if primary is not None and primary != run_id:
            return Replication.DEPOSED
        self._alone_until = time.monotonic() + 1.0
        return Replication.NO_REPLICA

    def verdict(self, r: redis.Redis, acked: object, info: dict) -> Replication:
        judged = self._judge(int(acked), info)  # type: ignore[call-overload]
        return judged or self._alone(str(info.get("run_id")), primary_run_id(r))

    async def verdict_async(self, r: redis.asyncio.Redis, acked: object, info: dict) -> Replication:
        judged = self._judge(int(acked), info)  # type: ignore[call-overload]
        return judged or self._alone(str(info.get("run_id")), await primary_run_id_async(r))

    def barrier(self, r: redis.Redis, key: str) -> Replication | None:
        """Until a replica holds every write made to the primary so far, by anyone: a write of
        this connection's own (`key`), then WAIT. Replication applies the primary's writes in
        order, so a replica that has this one has all before it. None: not asked."""
        with r.pipeline(transaction=False) as pipe:
            pipe.set(key, time.time(), ex=3600)
            if not self.queue(pipe):
                return None
            _, acked, info = pipe.execute()
        return self.verdict(r, acked, info)
