"""`prime-swarm chaos` accounts for every submitted rollout from the records the services keep
(streams, consumer groups, the trainer's audit hashes): each fate below is set up in a real
Redis the way the services would leave it."""

from __future__ import annotations

import random

import redis
from rollout_messages import submitted, verdict, verified

from prime_swarm.deploy.local.books import account
from prime_swarm.deploy.local.chaos import PARTS, kill_plan
from prime_swarm.protocol import streams
from prime_swarm.protocol.trainer_records import DROPPED, TRAINED_BY_STEP


def _consume(r: redis.Redis, stream: str, group: str, ack: set[str]) -> None:
    """Deliver every entry to `group`; acknowledge those whose submission is in `ack`."""
    for entry_id, fields in r.xreadgroup(group, "c", {stream: ">"}, count=100)[0][1]:
        raw = fields[streams.FIELD.encode()].decode()
        if any(f'"submission_id":"{sid}"' in raw for sid in ack):
            r.xack(stream, group, entry_id)


def test_every_fate_is_told_apart(redis_client: redis.Redis) -> None:
    r = redis_client
    subs = [submitted(n) for n in range(7)]
    r.xgroup_create(streams.ROLLOUTS_SUBMITTED, streams.VALIDATOR_GROUP, id="0", mkstream=True)
    r.xgroup_create(streams.ROLLOUTS_VERIFIED, streams.TRAINER_GROUP, id="0", mkstream=True)
    for s in subs[:6]:
        r.xadd(streams.ROLLOUTS_SUBMITTED, streams.encode(s))
    # s-5 was delivered to a validator that died before acknowledging it; s-6 arrives after.
    _consume(r, streams.ROLLOUTS_SUBMITTED, streams.VALIDATOR_GROUP, {"s-0", "s-1", "s-2", "s-3"})
    r.xadd(streams.ROLLOUTS_SUBMITTED, streams.encode(subs[6]))
    for s in (subs[0], subs[1], subs[3]):
        r.xadd(streams.ROLLOUTS_VERIFIED, streams.encode(verified(s)))
    r.xadd(streams.ROLLOUTS_REJECTED, streams.encode(verdict(subs[2], "bad_proof")))
    _consume(r, streams.ROLLOUTS_VERIFIED, streams.TRAINER_GROUP, {"s-0", "s-1", "s-3"})
    r.xadd(streams.ROLLOUTS_VERIFIED, streams.encode(verified(subs[4])))  # not read yet
    r.hset(TRAINED_BY_STEP, mapping={"1": "s-0,s-1", "2": "s-1"})  # s-1 in two steps
    r.hset(DROPPED, "s-3", "stale")
    # s-4 was acknowledged by the validators and verified; the trainer never read it.
    r.xack(
        streams.ROLLOUTS_SUBMITTED,
        streams.VALIDATOR_GROUP,
        *[e for e, _ in r.xrange(streams.ROLLOUTS_SUBMITTED)][4:5],
    )

    books = account(r, onchain_units=12)
    assert books["rollouts"] == {
        "submitted": 7,
        "trained": 2,
        "rejected": 1,
        "expired": 4,
        "trained_twice": 1,
        "unaccounted": 0,
    }
    assert books["trained_twice_ids"] == ["s-1"]
    assert books["rejected_by_reason"] == {"bad_proof": 1}
    assert books["expired_by_reason"] == {
        "stale": 1,
        "run_ended_before_training": 1,
        "run_ended_before_validation": 2,  # s-5 pending, s-6 never delivered
    }
    assert books["validator_units"] == 12  # s-0, s-1, s-3, s-4 accepted, 3 units each
    assert books["onchain_units"] == 12

    # A submission the validators acknowledged without any verdict is lost.
    r.xadd(streams.ROLLOUTS_SUBMITTED, streams.encode(submitted(7)))
    _consume(r, streams.ROLLOUTS_SUBMITTED, streams.VALIDATOR_GROUP, {"s-7"})
    books = account(r, onchain_units=12)
    assert books["rollouts"]["unaccounted"] == 1
    assert books["unaccounted_ids"] == ["s-7"]


def test_kill_plan_kills_every_part_the_asked_number_of_times() -> None:
    plan = kill_plan(random.Random(3), 3, PARTS)
    assert sorted(plan) == sorted(PARTS * 3)
    assert plan != kill_plan(random.Random(4), 3, PARTS)
