"""The validator's bookkeeping against real Redis: it counts each worker's verdicts in the
transaction that records them (services/validator/loop.py `_commit`), where the orchestrator's
status API reads them, and it judges nothing it could not check."""

from __future__ import annotations

import time
from collections import defaultdict
from types import SimpleNamespace

import redis
from rollout_messages import WORKER, submitted, verdict, verified

from prime_swarm.libs.policy.store import PolicyError
from prime_swarm.libs.rollout.recipe import Recipe
from prime_swarm.libs.streams.consumer import GroupReader
from prime_swarm.protocol import streams
from prime_swarm.protocol import worker_stats as ws
from prime_swarm.protocol.messages import PolicyAnnouncement, SubmittedRollout
from prime_swarm.services.validator.loop import Decided, Validator


def test_commit_counts_accepted_units_and_rejections_by_reason(
    redis_client: redis.Redis,
) -> None:
    validator = Validator.__new__(Validator)  # only what `_commit` touches: no chain, no model
    validator.r = redis_client
    validator.queue = SimpleNamespace(key="validator:1:chain_queue")
    validator.counts = defaultdict(int)
    validator.device_class = "cpu"  # the submissions' own class: no spot checks
    validator.settings = SimpleNamespace(audit_fraction=1.0, recipe=Recipe())
    batch = []
    reasons = (None, None, "bad_proof", "stale_policy", "bad_proof", "held_for_recheck")
    for n, reason in enumerate(reasons):
        msg = submitted(n)
        v = verdict(msg, reason)
        batch.append(Decided(f"0-{n + 1}", msg, v, verified(msg) if reason is None else None))
    started = ws.minute(time.time())
    validator._commit(batch, [])

    totals = redis_client.hgetall(ws.VALIDATOR_WORKER.format(worker=WORKER.lower()))
    assert totals == {
        b"accepted": b"2",
        b"units": b"6",
        b"rejected:bad_proof": b"2",
        b"rejected:stale_policy": b"1",
        b"rejected:held_for_recheck": b"1",
    }
    # Slashes for the two bad proofs only: stale work and held work are never slashed.
    actions = [a.decode() for a in redis_client.lrange("validator:1:chain_queue", 0, -1)]
    assert len(actions) == 4 and sum('"slash"' in a for a in actions) == 2
    # This minute's bucket (or the last one's, if a minute turned during the commit).
    buckets = {
        ws.VALIDATOR_ACCEPTED_PER_MINUTE.format(minute=m) for m in (started, ws.minute(time.time()))
    }
    assert sum(int(redis_client.hget(b, WORKER.lower()) or 0) for b in buckets) == 2
    assert all(redis_client.ttl(b) <= ws.BUCKET_TTL_S for b in buckets)
    assert 0 < redis_client.ttl(ws.VALIDATOR_WORKER.format(worker=WORKER.lower()))
    assert redis_client.xlen(streams.ROLLOUTS_VERIFIED) == 2
    assert redis_client.xlen(streams.ROLLOUTS_REJECTED) == 4


class _UnreachablePolicy:
    """A policy store whose relays are all down: every fetch fails, as `PolicyStore` reports."""

    def __init__(self) -> None:
        self.tries = 0

    def get(self, version: int, relays: list[str]) -> None:
        self.tries += 1
        raise PolicyError(f"could not fetch policy v{version}: all relays refused")


def announce(r: redis.Redis, version: int) -> None:
    ann = PolicyAnnouncement(
        version=version, step=version, model_hash="h", manifest_path=f"v{version}/manifest"
    )
    r.xadd(streams.POLICY_ANNOUNCEMENTS, streams.encode(ann))


def queue_work(r: redis.Redis, n: int, version: int = 0) -> None:
    """`n` different pieces of work at policy `version` (not one replayed) on the stream."""
    for i in range(n):
        msg = submitted(i)
        done = msg.submission.completions[0].model_copy(update={"token_ids": [2, 3, 4 + i]})
        work = msg.submission.model_copy(update={"policy_version": version, "completions": [done]})
        r.xadd(
            streams.ROLLOUTS_SUBMITTED, streams.encode(msg.model_copy(update={"submission": work}))
        )


def validator_without_policies(
    r: redis.Redis, min_idle_ms: int = 30_000
) -> tuple[Validator, _UnreachablePolicy]:
    """A validator reading the submitted stream whose every policy fetch fails."""
    validator = Validator.__new__(Validator)
    validator.r = r
    validator.settings = SimpleNamespace(recipe=Recipe(async_level=1), relays=["http://x"])
    validator.reader = GroupReader(
        r,
        streams.ROLLOUTS_SUBMITTED,
        streams.VALIDATOR_GROUP,
        "v",
        SubmittedRollout,
        min_idle_ms=min_idle_ms,
    )
    validator.queue = SimpleNamespace(key="validator:1:chain_queue")
    validator.counts = defaultdict(int)
    validator.store = store = _UnreachablePolicy()
    return validator, store


def test_a_policy_the_validator_cannot_fetch_defers_the_submission_instead_of_judging_it(
    redis_client: redis.Redis,
) -> None:
    """The version was announced (the trainer signed it), so failing to fetch it is the
    validator's problem: no verdict, no slash, the entry stays pending for a later try."""
    announce(redis_client, 0)
    queue_work(redis_client, 3)
    validator, store = validator_without_policies(redis_client)

    validator.validate_batch(validator.reader.read(10, block_ms=100))

    assert store.tries == 1  # one failed fetch per version per batch, not one per submission
    assert redis_client.xlen(streams.ROLLOUTS_REJECTED) == 0
    assert redis_client.xlen(streams.ROLLOUTS_VERIFIED) == 0
    assert redis_client.llen("validator:1:chain_queue") == 0
    pending = redis_client.xpending(streams.ROLLOUTS_SUBMITTED, streams.VALIDATOR_GROUP)
    assert pending["pending"] == 3


def test_work_newer_than_the_announcement_waits_for_it_and_is_never_slashed(
    redis_client: redis.Redis,
) -> None:
    """The orchestrator admitted v1 while v1 was announced; a Redis failover then lost that
    announcement (the trainer's XADD had not replicated), so the validator reads v0. The worker
    did nothing wrong: no verdict, no slash, the work stays pending, and once v1 is announced
    again the reclaimed work goes on to be judged (here, to the fetch of v1)."""
    announce(redis_client, 0)
    queue_work(redis_client, 2, version=1)
    # min_idle_ms 0: the next read reclaims what this one left pending.
    validator, store = validator_without_policies(redis_client, min_idle_ms=0)

    validator.validate_batch(validator.reader.read(10, block_ms=100))

    assert store.tries == 0  # deferred before any fetch
    assert redis_client.xlen(streams.ROLLOUTS_REJECTED) == 0
    assert redis_client.llen("validator:1:chain_queue") == 0
    pending = redis_client.xpending(streams.ROLLOUTS_SUBMITTED, streams.VALIDATOR_GROUP)
    assert pending["pending"] == 2

    announce(redis_client, 1)
    validator.validate_batch(validator.reader.read(10, block_ms=100))

    assert store.tries == 1  # past the version check now: to the fetch (down here, deferred)
    assert redis_client.xlen(streams.ROLLOUTS_REJECTED) == 0
    assert redis_client.llen("validator:1:chain_queue") == 0
