"""The newest policy announcement: which version the pool is on.

The trainer appends a `PolicyAnnouncement` to `protocol.streams.POLICY_ANNOUNCEMENTS` for each
version it publishes. The orchestrator (what it hands workers), the validator (what it admits)
and the trainer (where it resumes) each need the newest one; they read it here, so that what
"newest" means and how an entry is decoded is written once. Sync and async Redis clients answer
the same query, hence a function for each.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis
import redis.asyncio

from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import PolicyAnnouncement


def latest_announcement(r: redis.Redis) -> PolicyAnnouncement | None:
    """The newest announcement, or None before the first."""
    return _newest(r.xrevrange(streams.POLICY_ANNOUNCEMENTS, count=1))


async def latest_announcement_async(r: redis.asyncio.Redis) -> PolicyAnnouncement | None:
    """`latest_announcement` for an asyncio client."""
    return _newest(await r.xrevrange(streams.POLICY_ANNOUNCEMENTS, count=1))


def _newest(entries: Sequence[tuple[bytes | str, dict]]) -> PolicyAnnouncement | None:
    return streams.decode(PolicyAnnouncement, entries[0][1]) if entries else None
