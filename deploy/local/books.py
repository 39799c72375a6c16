"""The pool's books: every submitted rollout's fate, from the records the services keep anyway
(Redis streams, the trainer's audit hashes) and the chain's attested units. `prime-swarm chaos`
and the compose test (tests/compose) close their runs with it; in a compose deployment it reads
Redis as the read-only `auditor` user of deploy/redis_acl.py.

- trained: in a saved step's trained list (`trainer:trained_by_step`); in two lists: trained twice;
- rejected: a validator verdict said no, with its reason;
- expired: not trained, with a reason: dropped by the trainer (stale, zero variance), or still
  queued for a validator or the trainer when the run ended;
- unaccounted: none of those, i.e. lost.

The chain's attested units must equal the units of the validators' accepted verdicts.
"""

from __future__ import annotations

from collections import Counter

import redis

from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import SubmittedRollout, Verdict, VerifiedRollout
from prime_swarm.services.trainer.persist import DROPPED, TRAINED_BY_STEP


def _entries(r: redis.Redis, stream: str, model: type) -> list[tuple[str, object]]:
    return [(entry_id.decode(), streams.decode(model, f)) for entry_id, f in r.xrange(stream)]


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


def _unfinished(r: redis.Redis, stream: str, group: str) -> set[str]:
    """Entry ids of `stream` that `group` has not acknowledged: pending or never delivered."""
    groups = {g["name"].decode(): g for g in r.xinfo_groups(stream)}
    if group not in groups:
        return {e.decode() for e, _ in r.xrange(stream)}
    last = _id_key(groups[group]["last-delivered-id"].decode())
    pending = {p["message_id"].decode() for p in r.xpending_range(stream, group, "-", "+", 10**6)}
    undelivered = {e.decode() for e, _ in r.xrange(stream) if _id_key(e.decode()) > last}
    return pending | undelivered


def account(r: redis.Redis, onchain_units: int) -> dict[str, object]:
    """Every submitted rollout's fate (see the module notes)."""
    submitted = _entries(r, streams.ROLLOUTS_SUBMITTED, SubmittedRollout)
    verified = _entries(r, streams.ROLLOUTS_VERIFIED, VerifiedRollout)
    rejected = _entries(r, streams.ROLLOUTS_REJECTED, Verdict)
    unvalidated = _unfinished(r, streams.ROLLOUTS_SUBMITTED, streams.VALIDATOR_GROUP)
    untrained = _unfinished(r, streams.ROLLOUTS_VERIFIED, streams.TRAINER_GROUP)

    trained_count: Counter[str] = Counter()
    for ids in r.hgetall(TRAINED_BY_STEP).values():
        trained_count.update(i for i in ids.decode().split(",") if i)
    dropped = {k.decode(): v.decode() for k, v in r.hgetall(DROPPED).items()}

    accepted_units: dict[str, int] = {}
    queued_for_trainer: set[str] = set()
    for entry_id, v in verified:
        accepted_units.setdefault(v.submission_id, v.verdict.units)  # type: ignore[attr-defined]
        if entry_id in untrained:
            queued_for_trainer.add(v.submission_id)  # type: ignore[attr-defined]
    reasons = {v.submission_id: str(v.reason) for _, v in rejected}  # type: ignore[attr-defined]

    # submission id -> (kind, reason)
    outcome: dict[str, tuple[str, str]] = {}
    for entry_id, s in submitted:
        sid = s.submission_id  # type: ignore[attr-defined]
        if sid in trained_count:
            outcome[sid] = ("trained", "")
        elif sid in reasons:
            outcome[sid] = ("rejected", reasons[sid])
        elif sid in dropped:
            outcome[sid] = ("expired", dropped[sid])
        elif sid in queued_for_trainer:
            outcome[sid] = ("expired", "run_ended_before_training")
        elif entry_id in unvalidated:
            outcome[sid] = ("expired", "run_ended_before_validation")
        else:
            outcome[sid] = ("unaccounted", "")
    kinds = Counter(kind for kind, _ in outcome.values())
    trained_twice = sorted(i for i, n in trained_count.items() if n > 1)
    return {
        "rollouts": {
            "submitted": len(outcome),
            "trained": kinds["trained"],
            "rejected": kinds["rejected"],
            "expired": kinds["expired"],
            "trained_twice": len(trained_twice),
            "unaccounted": kinds["unaccounted"],
        },
        "rejected_by_reason": _reasons(outcome, "rejected"),
        "expired_by_reason": _reasons(outcome, "expired"),
        "trained_twice_ids": trained_twice[:20],
        "unaccounted_ids": sorted(s for s, (k, _) in outcome.items() if k == "unaccounted")[:20],
        # Trained ids that no submission explains would be fabricated work.
        "trained_not_submitted": len(set(trained_count) - set(outcome)),
        "onchain_units": onchain_units,
        "validator_units": sum(accepted_units.values()),
    }


def _reasons(outcome: dict[str, tuple[str, str]], kind: str) -> dict[str, int]:
    return dict(Counter(reason for k, reason in outcome.values() if k == kind))
