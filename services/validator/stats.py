"""The validator's per-worker counters (protocol/worker_stats.py): what it accepted, rejected
and credited, counted in the transaction that records the verdict."""

from __future__ import annotations

import time

import redis

from prime_swarm.protocol import worker_stats as ws
from prime_swarm.protocol.messages import Verdict


def count_verdict(pipe: redis.client.Pipeline, verdict: Verdict, now: float | None = None) -> None:
    """Queue the counter updates of one verdict on `pipe` (the verdict's own transaction, so
    the counts move exactly when the verdict is acknowledged): a few O(1) commands."""
    worker = verdict.worker
    totals = ws.VALIDATOR_WORKER.format(worker=worker)
    if verdict.accepted:
        pipe.hincrby(totals, ws.ACCEPTED, 1)
        pipe.hincrby(totals, ws.UNITS, verdict.units)
        bucket = ws.VALIDATOR_ACCEPTED_PER_MINUTE.format(
            minute=ws.minute(time.time() if now is None else now)
        )
        pipe.hincrby(bucket, worker, 1)
        pipe.expire(bucket, ws.BUCKET_TTL_S)
    else:
        pipe.hincrby(totals, ws.REJECTED_PREFIX + str(verdict.reason), 1)
        if verdict.detail:
            pipe.hset(totals, ws.WHY_PREFIX + str(verdict.reason), verdict.detail[: ws.WHY_CHARS])
    pipe.expire(totals, ws.TOTALS_TTL_S)
