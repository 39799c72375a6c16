"""Per-worker counters in Redis: kept by the role that learns each fact, read by the orchestrator.

The orchestrator counts leases and submissions (services/orchestrator/state.py); the validator
counts verdicts and the units it credits (services/validator/stats.py), in the same transaction
as the verdict, so a counter moves exactly when a verdict is acknowledged. Each event costs a
few O(1) commands; the status API reads a handful of hashes and never scans a stream.

Throughput comes from per-minute buckets: one hash per minute (worker -> count) that expires
once it has left the window. A rate is the sum over the window's buckets divided by the time
they cover, the current minute included so far: `WINDOW_MINUTES` full minutes plus a part.
"""

from __future__ import annotations

from collections.abc import Iterable

# Written by the validator (its `validator:*` prefix), read by the orchestrator.
VALIDATOR_WORKER = "validator:worker:{worker}"  # hash: accepted, units, rejected:<reason>
VALIDATOR_ACCEPTED_PER_MINUTE = "validator:accepted:{minute}"  # hash: worker -> accepted
ACCEPTED, UNITS, REJECTED_PREFIX = "accepted", "units", "rejected:"
# "why:<reason>" -> the last such verdict's detail: the statistic that decided and its limit,
# so a contributor can tell an honest-stack problem from a cheat (at most WHY_CHARS of it).
WHY_PREFIX, WHY_CHARS = "why:", 400

BUCKET_S = 60
WINDOW_MINUTES = 5
# A bucket lives as long as a reader may still include it, plus slack for clock skew.
BUCKET_TTL_S = (WINDOW_MINUTES + 2) * BUCKET_S
# Lifetime totals of a worker outlive its last event by this long, then go: a worker that
# left a month ago is history, and throwaway keys must not pile up forever.
TOTALS_TTL_S = 30 * 24 * 3600


def minute(t: float) -> int:
    """The bucket of unix time `t`."""
    return int(t // BUCKET_S)


def window(now: float) -> list[int]:
    """The buckets a rate at `now` reads, oldest first (the current, partial one last)."""
    current = minute(now)
    return list(range(current - WINDOW_MINUTES, current + 1))


def window_seconds(now: float) -> float:
    """The time the buckets of `window(now)` cover: the full minutes and the current part."""
    return WINDOW_MINUTES * BUCKET_S + (now - minute(now) * BUCKET_S)


def per_minute(counts: Iterable[int], now: float) -> float:
    """Events per minute from the counts of `window(now)`'s buckets."""
    return sum(counts) * 60.0 / window_seconds(now)
