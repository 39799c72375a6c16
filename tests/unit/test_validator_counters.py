"""The validator counts each worker's verdicts in the transaction that records them
(services/validator/loop.py `_commit`), where the orchestrator's status API reads them."""

from __future__ import annotations

import time
from collections import defaultdict
from types import SimpleNamespace

import redis
from rollout_messages import WORKER, submitted, verdict, verified

from prime_swarm.protocol import streams
from prime_swarm.protocol import worker_stats as ws
from prime_swarm.services.validator.loop import Validator


def test_commit_counts_accepted_units_and_rejections_by_reason(
    redis_client: redis.Redis,
) -> None:
    validator = Validator.__new__(Validator)  # only what `_commit` touches: no chain, no model
    validator.r = redis_client
    validator.queue = SimpleNamespace(key="validator:1:chain_queue")
    validator.counts = defaultdict(int)
    batch = []
    for n, reason in enumerate((None, None, "bad_proof", "stale_policy", "bad_proof")):
        msg = submitted(n)
        v = verdict(msg, reason)
        batch.append((f"0-{n + 1}", msg, v, verified(msg) if reason is None else None))
    started = ws.minute(time.time())
    validator._commit(batch, [])

    totals = redis_client.hgetall(ws.VALIDATOR_WORKER.format(worker=WORKER.lower()))
    assert totals == {
        b"accepted": b"2",
        b"units": b"6",
        b"rejected:bad_proof": b"2",
        b"rejected:stale_policy": b"1",
    }
    # This minute's bucket (or the last one's, if a minute turned during the commit).
    buckets = {
        ws.VALIDATOR_ACCEPTED_PER_MINUTE.format(minute=m) for m in (started, ws.minute(time.time()))
    }
    assert sum(int(redis_client.hget(b, WORKER.lower()) or 0) for b in buckets) == 2
    assert all(redis_client.ttl(b) <= ws.BUCKET_TTL_S for b in buckets)
    assert 0 < redis_client.ttl(ws.VALIDATOR_WORKER.format(worker=WORKER.lower()))
    assert redis_client.xlen(streams.ROLLOUTS_VERIFIED) == 2
    assert redis_client.xlen(streams.ROLLOUTS_REJECTED) == 3
