"""How long a stream keeps its entries: the retention rule.

An entry is trimmed only when every consumer group of its stream has acknowledged it (its effect
is durable downstream: a verdict committed, a step saved) and it is older than
`protocol.streams.RETENTION_S`, the grace that readers outside the groups (the operator's books,
a dashboard) have to see it. A stream without consumer groups is a record (the rejected
verdicts): trimmed by age alone. Each service trims the streams it consumes, so the rule needs
no process of its own.

Without it the streams are the pool's whole history: 44 thousand submitted and as many verified
entries an hour on two cores, 500 MB of Redis memory (bench/results/soak.json of 2026-11-28).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import redis

from prime_swarm.protocol import streams

log = logging.getLogger("retention")
StreamId = tuple[int, int]


def parse_id(entry_id: bytes | str) -> StreamId:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def format_id(entry_id: StreamId) -> str:
    return f"{entry_id[0]}-{entry_id[1]}"


def group_floor(last_delivered: StreamId, oldest_pending: StreamId | None) -> StreamId:
    """The oldest entry a group still needs: its oldest unacknowledged one, else the first it
    has not been given."""
    if oldest_pending is not None:
        return oldest_pending
    return last_delivered[0], last_delivered[1] + 1


def trim_floor(group_floors: Sequence[StreamId], now_s: float, keep_s: float) -> StreamId:
    """Entries below this id may go: every group is past them and they are `keep_s` old."""
    by_age = (int((now_s - keep_s) * 1000), 0)
    return min([by_age, *group_floors])


def entries_added(r: redis.Redis, stream: str) -> int:
    """Every entry the stream was ever given, trimmed ones included (0 before its first)."""
    try:
        return int(r.xinfo_stream(stream)["entries-added"])
    except redis.ResponseError:  # no such key yet
        return 0


def trim(
    r: redis.Redis, stream: str, keep_s: float = streams.RETENTION_S, exact: bool = False
) -> int:
    """Apply the rule to `stream` now; returns how many entries went. Not `exact`: Redis drops
    whole nodes of the stream only (100 entries by default), trimming less, never more."""
    try:
        groups = r.xinfo_groups(stream)
    except redis.ResponseError:  # no such key yet
        return 0
    floors = []
    for g in groups:
        pending = r.xpending(stream, g["name"]) if int(g["pending"]) else None
        oldest = parse_id(pending["min"]) if pending and pending["pending"] else None
        floors.append(group_floor(parse_id(g["last-delivered-id"]), oldest))
    # Floors only rise (deliveries and acknowledgements move them forward), so one computed a
    # moment ago is still safe when the trim runs.
    floor = trim_floor(floors, time.time(), keep_s)
    return int(r.xtrim(stream, minid=format_id(floor), approximate=not exact))


class Retention:
    """Trims `names` behind their consumers, at most once every `every_s` (the rule costs two
    or three commands a stream; a consumer calls `maybe_trim` after each batch)."""

    def __init__(
        self,
        r: redis.Redis,
        names: Sequence[str],
        keep_s: float = streams.RETENTION_S,
        every_s: float = 10.0,
    ) -> None:
        self.r, self.names, self.keep_s, self.every_s = r, tuple(names), keep_s, every_s
        self._next = 0.0

    def maybe_trim(self) -> int:
        now = time.monotonic()
        if now < self._next:
            return 0
        self._next = now + self.every_s
        try:
            return sum(trim(self.r, name, self.keep_s) for name in self.names)
        except redis.RedisError as exc:  # a failover under way: the next call tries again
            log.warning("trimming %s failed: %s", ",".join(self.names), exc)
            return 0
