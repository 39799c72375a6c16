"""The pool's books: every submitted rollout's fate, from the records the services keep anyway
(Redis streams, the trainer's audit hashes) and the chain's attested units. `prime-swarm chaos`,
`soak` and the compose test (tests/compose) close their runs with it; in a compose deployment it
reads Redis as the read-only `auditor` user of deploy/redis_acl.py.

- trained: in a saved step's trained list (`trainer:trained_by_step`); in two lists: trained twice;
- rejected: a validator verdict said no, with its reason;
- expired: not trained, with a reason: dropped by the trainer (stale, zero variance), or still
  queued for a validator or the trainer when the run ended;
- unaccounted: none of those, i.e. lost.

The chain's attested units must equal the units of the validators' accepted verdicts.

The streams are trimmed behind their consumers (libs/streams/retention.py), so the books keep
what they need of each entry (its submission id, units, reason) as they read, and a run longer
than `streams.RETENTION_S` calls `read` more often than that. Each read is one transaction (a
snapshot of every stream and hash at one instant) and re-reads the last `rewind_s` of every
stream: a failover may take back the newest few seconds of writes, and the books must not keep
an entry the new primary never had. A stream's `entries-added` (every entry it was ever given)
checks that nothing went unread: trimmed first, or taken back further than the rewind.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from prime_swarm.libs.chain.models import Work
from prime_swarm.libs.streams.retention import format_id, parse_id
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import (
    SubmittedRollout,
    Verdict,
    VerifiedRollout,
    normal_address,
)
from prime_swarm.protocol.trainer_records import DROPPED, TRAINED_BY_STEP

# What the books keep of an entry: the submission id, and the work it answers (submitted: its
# chain item, `worker/work id`), its units (verified) or the reason (rejected).
Record = tuple[str, int | str]


def work_key(worker: str, work_id: int) -> str:
    return f"{normal_address(worker)}/{work_id}"


def _record(stream: str, fields: dict) -> Record:
    if stream == streams.ROLLOUTS_SUBMITTED:
        sub = streams.decode(SubmittedRollout, fields)
        return sub.submission_id, work_key(sub.lease.worker, sub.lease.work_id)
    if stream == streams.ROLLOUTS_VERIFIED:
        v = streams.decode(VerifiedRollout, fields)
        return v.submission_id, v.verdict.units
    verdict = streams.decode(Verdict, fields)
    return verdict.submission_id, str(verdict.reason)


class BooksGap(RuntimeError):
    """Entries were added that the books never read: they cannot balance."""


@dataclass
class _Stream:
    name: str
    records: dict[str, Record] = field(default_factory=dict)  # entry id -> record, in id order

    def since(self, rewind_ms: int) -> str:
        """Where the next read starts: `rewind_ms` before the newest entry read."""
        if not self.records:
            return "-"
        ms, _ = parse_id(next(reversed(self.records)))
        return format_id((max(ms - rewind_ms, 0), 0))

    def replace_tail(self, start: str, entries: list, info: dict) -> None:
        """Re-read from `start`: a record there that the stream no longer holds was taken back
        by a failover, unless it lies below the stream's first entry (trimmed since it was
        read: the books keep it)."""
        if info["first-entry"] is not None:
            first = parse_id(info["first-entry"][0])
        else:  # empty: all it ever generated was trimmed
            last = parse_id(info["last-generated-id"])
            first = (last[0], last[1] + 1)
        floor = max(parse_id(start) if start != "-" else (0, 0), first)
        while self.records and parse_id(next(reversed(self.records))) >= floor:
            self.records.popitem()
        for entry_id, fields in entries:
            self.records.setdefault(entry_id.decode(), _record(self.name, fields))
        added = int(info["entries-added"])
        if len(self.records) != added:
            raise BooksGap(
                f"{self.name}: {added} entries added, {len(self.records)} read: "
                + (
                    f"read more often than every {streams.RETENTION_S:.0f} s (the retention)"
                    if added > len(self.records)
                    else "a failover took back entries older than the rewind"
                )
            )


class Books:
    """Every submitted rollout's fate, read as the run goes (see the module notes)."""

    STREAMS = (streams.ROLLOUTS_SUBMITTED, streams.ROLLOUTS_VERIFIED, streams.ROLLOUTS_REJECTED)
    # Consumer groups whose unfinished entries are work still queued, not lost.
    GROUPS = {
        streams.ROLLOUTS_SUBMITTED: streams.VALIDATOR_GROUP,
        streams.ROLLOUTS_VERIFIED: streams.TRAINER_GROUP,
    }

    def __init__(self, rewind_s: float = 60.0) -> None:
        self.rewind_ms = int(rewind_s * 1000)
        self.streams = {name: _Stream(name) for name in self.STREAMS}

    def read(self, r: redis.Redis) -> None:
        """Catch up with the streams."""
        self._snapshot(r, with_fates=False)

    def _snapshot(self, r: redis.Redis, with_fates: bool) -> dict[str, Any]:
        starts = {name: s.since(self.rewind_ms) for name, s in self.streams.items()}
        pipe = r.pipeline(transaction=True)
        for name in self.STREAMS:
            pipe.xrange(name, starts[name], "+")
            pipe.xinfo_stream(name)
        if with_fates:
            for stream, group in self.GROUPS.items():
                pipe.xinfo_groups(stream)
                pipe.xpending_range(stream, group, "-", "+", 10**7)
            pipe.hgetall(TRAINED_BY_STEP)
            pipe.hgetall(DROPPED)
        replies = iter(pipe.execute(raise_on_error=False))
        for name in self.STREAMS:
            entries, info = next(replies), next(replies)
            if isinstance(info, redis.ResponseError):  # the stream does not exist yet
                entries, info = (
                    [],
                    {"entries-added": 0, "first-entry": None, "last-generated-id": "0-0"},
                )
            self.streams[name].replace_tail(starts[name], entries, info)
        if not with_fates:
            return {}
        unfinished = {}
        for stream, group in self.GROUPS.items():
            groups, pending = next(replies), next(replies)
            unfinished[stream] = self._unfinished(stream, group, groups, pending)
        trained_by_step, dropped = next(replies), next(replies)
        return {"unfinished": unfinished, "trained_by_step": trained_by_step, "dropped": dropped}

    def _unfinished(self, stream: str, group: str, groups: Any, pending: Any) -> set[str]:
        """Entry ids of `stream` that `group` has not acknowledged: pending or never delivered."""
        records = self.streams[stream].records
        info = None
        if not isinstance(groups, redis.ResponseError):
            info = next((g for g in groups if g["name"].decode() == group), None)
        if info is None or isinstance(pending, redis.ResponseError):
            return set(records)
        last = parse_id(info["last-delivered-id"])
        undelivered = {e for e in records if parse_id(e) > last}
        return {p["message_id"].decode() for p in pending} | undelivered

    def counts(self) -> dict[str, Any]:
        """Entries read so far per stream, and the rejections by reason."""
        rejected = self.streams[streams.ROLLOUTS_REJECTED].records.values()
        return {
            "submitted": len(self.streams[streams.ROLLOUTS_SUBMITTED].records),
            "verified": len(self.streams[streams.ROLLOUTS_VERIFIED].records),
            "rejected": len(rejected),
            "rejected_by_reason": dict(Counter(str(reason) for _, reason in rejected)),
        }

    def account(self, r: redis.Redis, onchain_units: int) -> dict[str, object]:
        """Every submitted rollout's fate now (see the module notes)."""
        snap = self._snapshot(r, with_fates=True)
        unvalidated = snap["unfinished"][streams.ROLLOUTS_SUBMITTED]
        untrained = snap["unfinished"][streams.ROLLOUTS_VERIFIED]
        trained_count: Counter[str] = Counter()
        for ids in snap["trained_by_step"].values():
            trained_count.update(i for i in ids.decode().split(",") if i)
        dropped = {k.decode(): v.decode() for k, v in snap["dropped"].items()}

        accepted_units: dict[str, int] = {}
        queued_for_trainer: set[str] = set()
        for entry_id, (sid, units) in self.streams[streams.ROLLOUTS_VERIFIED].records.items():
            accepted_units.setdefault(sid, int(units))
            if entry_id in untrained:
                queued_for_trainer.add(sid)
        rejected = self.streams[streams.ROLLOUTS_REJECTED].records.values()
        reasons = {sid: str(why) for sid, why in rejected}

        # submission id -> (kind, reason)
        outcome: dict[str, tuple[str, str]] = {}
        for entry_id, (sid, _) in self.streams[streams.ROLLOUTS_SUBMITTED].records.items():
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
            "unaccounted_ids": sorted(i for i, (k, _) in outcome.items() if k == "unaccounted")[
                :20
            ],
            # Trained ids that no submission explains would be fabricated work.
            "trained_not_submitted": len(set(trained_count) - set(outcome)),
            "onchain_units": onchain_units,
            "validator_units": sum(accepted_units.values()),
        }

    def chain_difference(self, on_chain: Iterable[Work]) -> dict[str, object]:
        """Item by item, where the chain's credited work and the validators' accepted verdicts
        disagree (read when their totals do): which side has what the other lacks."""
        work_of = dict(self.streams[streams.ROLLOUTS_SUBMITTED].records.values())
        verified: dict[str, int] = {}
        for sid, units in self.streams[streams.ROLLOUTS_VERIFIED].records.values():
            verified.setdefault(str(work_of.get(sid, f"unsubmitted:{sid}")), int(units))
        chain = {work_key(w.worker, w.work_id): w.units for w in on_chain}
        only_chain = sorted(set(chain) - set(verified))
        only_verified = sorted(set(verified) - set(chain))
        differ = sorted(k for k in set(chain) & set(verified) if chain[k] != verified[k])
        return {
            "only_on_chain": len(only_chain),
            "only_on_chain_units": sum(chain[k] for k in only_chain),
            "only_verified": len(only_verified),
            "only_verified_units": sum(verified[k] for k in only_verified),
            "units_differ": len(differ),
            "examples": {
                "only_on_chain": only_chain[:10],
                "only_verified": only_verified[:10],
                "units_differ": [(k, chain[k], verified[k]) for k in differ[:10]],
            },
        }


def account(r: redis.Redis, onchain_units: int) -> dict[str, object]:
    """The books of a run read once, at its end (nothing trimmed yet: shorter than the
    retention, or every entry still unfinished)."""
    return Books().account(r, onchain_units)


def _reasons(outcome: dict[str, tuple[str, str]], kind: str) -> dict[str, int]:
    return dict(Counter(reason for k, reason in outcome.values() if k == kind))
