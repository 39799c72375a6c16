"""Consumer-group reads that survive crashes.

A consumer first reclaims entries that another (dead) consumer read but never acknowledged
(`XAUTOCLAIM` after `min_idle_ms`), then reads new ones (`XREADGROUP >`). An entry is removed
from the pending list only by `XACK` after its effect is durable, so nothing is lost and, because
effects are keyed by message identity downstream, nothing is applied twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Generic, TypeVar

import redis
from pydantic import BaseModel, ValidationError

from prime_swarm.protocol import streams

M = TypeVar("M", bound=BaseModel)


@dataclass
class Entry(Generic[M]):
    entry_id: str
    message: M | None
    error: str | None = None  # set when the entry could not be decoded


def group_backlog(groups_info: list[dict], group: str, pending: bool = True) -> int:
    """From XINFO GROUPS: entries not yet delivered to `group`, plus (`pending`) those
    delivered and awaiting XACK. For gauges only: `lag` is a counter a failover can leave
    wrong; what must be exact counts from the last-delivered id (services/orchestrator/
    state.py `_RESERVE_LEASES`)."""
    for g in groups_info:
        name = g.get("name")
        if (name.decode() if isinstance(name, bytes) else name) == group:
            return int(g.get("lag") or 0) + (int(g.get("pending") or 0) if pending else 0)
    return 0


def ensure_group(r: redis.Redis, stream: str, group: str) -> None:
    try:
        r.xgroup_create(stream, group, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


POLL_S = 0.05


class GroupReader(Generic[M]):
    def __init__(
        self,
        r: redis.Redis,
        stream: str,
        group: str,
        consumer: str,
        model: type[M],
        min_idle_ms: int = 30_000,
    ) -> None:
        self.r, self.stream, self.group, self.consumer = r, stream, group, consumer
        self.model, self.min_idle_ms = model, min_idle_ms
        ensure_group(r, stream, group)

    def _decode(self, raw: list[tuple[bytes, dict]]) -> list[Entry[M]]:
        out: list[Entry[M]] = []
        for entry_id, fields in raw:
            eid = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
            if fields is None:  # entry deleted from the stream while pending
                out.append(Entry(eid, None, "entry was trimmed"))
                continue
            try:
                out.append(Entry(eid, streams.decode(self.model, fields)))
            except (ValidationError, ValueError) as exc:
                out.append(Entry(eid, None, f"undecodable entry: {exc}"[:500]))
        return out

    def reclaim(self, count: int) -> list[Entry[M]]:
        """Entries a dead consumer left pending for longer than `min_idle_ms`."""
        res = self.r.xautoclaim(
            self.stream, self.group, self.consumer, self.min_idle_ms, "0-0", count=count
        )
        return self._decode(res[1])

    def own_pending(self, count: int) -> list[Entry[M]]:
        """Entries this consumer name read before a restart but never acknowledged."""
        res = self.r.xreadgroup(self.group, self.consumer, {self.stream: "0"}, count=count)
        return self._decode(res[0][1]) if res else []

    def read(self, count: int, block_ms: int | None) -> list[Entry[M]]:
        """Reclaimed entries, else new ones (waiting up to `block_ms`; None: not at all).

        The wait is this client's, polling, not XREADGROUP's BLOCK: a client blocked on a
        primary through a failover was seen held by Redis 7.0 for over ten minutes (its
        200 ms block never expired: `prime-swarm chaos --redis-ha`, the trainer at a stop).
        A poll every 50 ms costs a few commands a second and no latency that matters."""
        reclaimed = self.reclaim(count)
        if reclaimed:
            return reclaimed
        deadline = time.monotonic() + (block_ms or 0) / 1000
        while True:
            res = self.r.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=count)
            if res or time.monotonic() >= deadline:
                return self._decode(res[0][1]) if res else []
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))

    def ack(self, *entry_ids: str) -> None:
        if entry_ids:
            self.r.xack(self.stream, self.group, *entry_ids)

    def lag(self) -> int:
        """Entries not yet delivered to the group plus those pending acknowledgement."""
        try:
            return group_backlog(self.r.xinfo_groups(self.stream), self.group)
        except redis.ResponseError:
            return 0
