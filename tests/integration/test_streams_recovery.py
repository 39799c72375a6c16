"""Consumer groups against a real redis-server: a crashed consumer loses nothing."""

import time

import redis

from prime_swarm.libs.streams.consumer import GroupReader
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import PolicyAnnouncement

STREAM = "test:announcements"


def announce(r: redis.Redis, v: int) -> None:
    msg = PolicyAnnouncement(version=v, step=v, model_hash="0" * 64, manifest_path=f"/m/{v}")
    r.xadd(STREAM, streams.encode(msg))


def test_entries_of_a_crashed_consumer_are_reclaimed(redis_client: redis.Redis) -> None:
    for v in range(3):
        announce(redis_client, v)
    crashed = GroupReader(redis_client, STREAM, "g", "crashed", PolicyAnnouncement, min_idle_ms=50)
    got = crashed.read(count=2, block_ms=100)
    assert [e.message.version for e in got] == [0, 1]
    # `crashed` dies without XACK. A survivor first gets new work, then, once the entries have
    # been idle long enough, the dead consumer's pending ones.
    survivor = GroupReader(
        redis_client, STREAM, "g", "survivor", PolicyAnnouncement, min_idle_ms=50
    )
    time.sleep(0.1)
    reclaimed = survivor.read(count=10, block_ms=100)
    assert sorted(e.message.version for e in reclaimed) == [0, 1]
    survivor.ack(*[e.entry_id for e in reclaimed])
    fresh = survivor.read(count=10, block_ms=100)
    assert [e.message.version for e in fresh] == [2]
    survivor.ack(*[e.entry_id for e in fresh])
    assert survivor.read(count=10, block_ms=50) == []
    assert survivor.lag() == 0


def test_a_restarted_consumer_sees_its_own_unacked_entries(redis_client: redis.Redis) -> None:
    announce(redis_client, 7)
    first = GroupReader(redis_client, STREAM, "g2", "c1", PolicyAnnouncement)
    assert [e.message.version for e in first.read(10, 100)] == [7]
    again = GroupReader(redis_client, STREAM, "g2", "c1", PolicyAnnouncement)
    assert [e.message.version for e in again.own_pending(10)] == [7]


def test_undecodable_entries_are_reported_not_raised(redis_client: redis.Redis) -> None:
    redis_client.xadd(STREAM, {"data": b"{not json"})
    redis_client.xadd(STREAM, {"other": b"x"})
    reader = GroupReader(redis_client, STREAM, "g3", "c", PolicyAnnouncement)
    got = reader.read(10, 100)
    assert len(got) == 2 and all(e.message is None and e.error for e in got)
