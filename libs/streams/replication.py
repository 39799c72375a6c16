"""Waiting for a write to reach a replica before telling anyone outside Redis about it.

Replication is asynchronous: a primary that dies takes with it whatever its replica had not
received yet (a suffix of its writes: the replica applies the primary's stream in order). Most
of what the pool writes is harmless to lose that way (docs/high-availability.md lists each
write and why); the writes that are acknowledged outward - a submission the worker is told is
in, a step's trained ids - are held until a replica has them (`WAIT`).

With no replica connected there is nothing to wait for: the write is acknowledged as a single
Redis would acknowledge it, and that loss needs a second failure (the primary lost before any
replica came back). Only a replica that is connected but silent past the timeout makes the
caller refuse: it answers "retry", and the retry is idempotent.
"""

from __future__ import annotations

import time
from enum import StrEnum

import redis
import redis.asyncio
import redis.asyncio.client
import redis.client

from .connection import SENTINEL_SCHEME

# A loopback replica confirms in well under a millisecond; a WAN one in a round trip. A second
# is long enough not to refuse a healthy pool, short enough for a worker's retry.
WAIT_TIMEOUT_MS = 1000


class Replication(StrEnum):
    REPLICATED = "replicated"  # a replica holds the write
    NO_REPLICA = "no_replica"  # none connected: acknowledged as a single Redis would
    LAGGING = "lagging"  # a replica is connected but did not confirm in time: refuse, retry


def has_replicas(url: str) -> bool:
    """Whether the deployment runs replicas at all: a Sentinel URL says so. A single Redis
    would answer WAIT only at its timeout, so it is not asked."""
    return url.startswith(SENTINEL_SCHEME + "://")


class ReplicaWait:
    """`WAIT 1` queued behind an acknowledged write, on the same connection (WAIT covers the
    writes of the connection it is sent on: a pipeline keeps them together), and the verdict.

    After NO_REPLICA it does not wait again for a second: until a replica is back, each WAIT
    would cost its whole timeout."""

    def __init__(self, enabled: bool, timeout_ms: int = WAIT_TIMEOUT_MS) -> None:
        self.enabled, self.timeout_ms = enabled, timeout_ms
        self._alone_until = 0.0

    def queue(self, pipe: redis.client.Pipeline | redis.asyncio.client.Pipeline) -> bool:
        """Queue the WAIT on `pipe` (after the write); False when there is none to wait for."""
        if not self.enabled or time.monotonic() < self._alone_until:
            return False
        pipe.execute_command("WAIT", 1, self.timeout_ms)
        return True

    def _verdict(self, acked: int, info: dict | None) -> Replication:
        if acked >= 1:
            return Replication.REPLICATED
        if info is not None and int(info.get("connected_slaves", 0)) > 0:
            return Replication.LAGGING
        self._alone_until = time.monotonic() + 1.0
        return Replication.NO_REPLICA

    def verdict(self, r: redis.Redis, acked: int) -> Replication:
        return self._verdict(acked, None if acked >= 1 else r.info("replication"))

    async def verdict_async(self, r: redis.asyncio.Redis, acked: int) -> Replication:
        return self._verdict(acked, None if acked >= 1 else await r.info("replication"))
