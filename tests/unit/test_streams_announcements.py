"""The one reader of the newest policy announcement, through a sync and an asyncio client."""

from __future__ import annotations

import asyncio

import redis
import redis.asyncio

from prime_swarm.libs.localnet.redis_server import RedisServer
from prime_swarm.libs.streams.announcements import latest_announcement, latest_announcement_async
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import PolicyAnnouncement


def announce(r: redis.Redis, version: int) -> PolicyAnnouncement:
    ann = PolicyAnnouncement(
        version=version, step=version * 2, model_hash="ab" * 32, manifest_path=f"/m/{version}"
    )
    r.xadd(streams.POLICY_ANNOUNCEMENTS, streams.encode(ann))
    return ann


def newest_async(url: str) -> PolicyAnnouncement | None:
    async def read() -> PolicyAnnouncement | None:
        client = redis.asyncio.Redis.from_url(url)
        try:
            return await latest_announcement_async(client)
        finally:
            await client.aclose()

    return asyncio.run(read())


def test_none_before_the_first_then_the_newest(
    redis_client: redis.Redis, redis_server: RedisServer
) -> None:
    assert latest_announcement(redis_client) is None
    assert newest_async(redis_server.url) is None
    announce(redis_client, 1)
    second = announce(redis_client, 2)
    assert latest_announcement(redis_client) == second
    assert newest_async(redis_server.url) == second
