"""The retention rule on a real Redis: an entry goes only once every group acknowledged it and it
is older than the grace, and the books, read as the run goes, still account for what went."""

from __future__ import annotations

import time

import pytest
import redis
from rollout_messages import submitted, verdict, verified

from prime_swarm.deploy.local.books import Books, BooksGap
from prime_swarm.libs.chain.models import Work
from prime_swarm.libs.streams.retention import entries_added, group_floor, trim, trim_floor
from prime_swarm.protocol import streams
from prime_swarm.protocol.trainer_records import TRAINED_BY_STEP

SUBMITTED, VERIFIED = streams.ROLLOUTS_SUBMITTED, streams.ROLLOUTS_VERIFIED
OLD_MS = int((time.time() - 2 * streams.RETENTION_S) * 1000)  # past the grace


def test_the_floor_is_the_oldest_entry_any_group_needs() -> None:
    assert group_floor((100, 4), oldest_pending=None) == (100, 5)
    assert group_floor((100, 4), oldest_pending=(90, 0)) == (90, 0)
    now = 1_000.0
    assert trim_floor([(900_000, 0), (950_000, 1)], now, keep_s=60) == (900_000, 0)
    assert trim_floor([(990_000, 0)], now, keep_s=60) == (940_000, 0)  # younger than the grace
    assert trim_floor([], now, keep_s=60) == (940_000, 0)  # no group: a record, by age alone


def _old(r: redis.Redis, stream: str, n: int, seq: int, message) -> str:  # type: ignore[no-untyped-def]
    return r.xadd(stream, streams.encode(message), id=f"{OLD_MS + n}-{seq}").decode()


def test_trim_keeps_what_a_group_has_not_acknowledged(redis_client: redis.Redis) -> None:
    r = redis_client
    r.xgroup_create(SUBMITTED, streams.VALIDATOR_GROUP, id="0", mkstream=True)
    ids = [_old(r, SUBMITTED, n, 0, submitted(n)) for n in range(6)]
    fresh = r.xadd(SUBMITTED, streams.encode(submitted(6))).decode()
    got = r.xreadgroup(streams.VALIDATOR_GROUP, "v", {SUBMITTED: ">"}, count=4)[0][1]
    assert [e.decode() for e, _ in got] == ids[:4]
    r.xack(SUBMITTED, streams.VALIDATOR_GROUP, ids[0], ids[1], ids[3])

    # ids[2] is pending (its validator may have died): it and everything after it stay, and so
    # do ids[4:] (never delivered) and the fresh entry (acknowledged or not, it is young).
    assert trim(r, SUBMITTED, exact=True) == 2
    assert [e.decode() for e, _ in r.xrange(SUBMITTED)] == [*ids[2:], fresh]

    r.xack(SUBMITTED, streams.VALIDATOR_GROUP, ids[2])
    assert trim(r, SUBMITTED, exact=True) == 2  # up to ids[4], the first not delivered
    rest = r.xreadgroup(streams.VALIDATOR_GROUP, "v", {SUBMITTED: ">"}, count=10)[0][1]
    r.xack(SUBMITTED, streams.VALIDATOR_GROUP, *[e for e, _ in rest])
    assert trim(r, SUBMITTED, exact=True) == 2
    assert [e.decode() for e, _ in r.xrange(SUBMITTED)] == [fresh]
    assert entries_added(r, SUBMITTED) == 7


def test_a_stream_without_groups_is_trimmed_by_age(redis_client: redis.Redis) -> None:
    r = redis_client
    _old(r, streams.ROLLOUTS_REJECTED, 0, 0, verdict(submitted(0), "bad_proof"))
    r.xadd(streams.ROLLOUTS_REJECTED, streams.encode(verdict(submitted(1), "bad_proof")))
    assert trim(r, streams.ROLLOUTS_REJECTED, exact=True) == 1
    assert r.xlen(streams.ROLLOUTS_REJECTED) == 1
    assert trim(r, "no:such:stream") == 0 and entries_added(r, "no:such:stream") == 0


def _settle(r: redis.Redis, n: int) -> None:
    """Submission n admitted, validated, verified and trained (its entries acknowledged)."""
    sub = submitted(n)
    _old(r, SUBMITTED, n, 0, sub)
    _old(r, VERIFIED, n, 0, verified(sub))
    for stream, group in ((SUBMITTED, streams.VALIDATOR_GROUP), (VERIFIED, streams.TRAINER_GROUP)):
        for entry_id, _ in r.xreadgroup(group, "c", {stream: ">"}, count=10)[0][1]:
            r.xack(stream, group, entry_id)
    r.hset(TRAINED_BY_STEP, str(n), sub.submission_id)


def test_books_read_as_the_run_goes_balance_after_trimming(redis_client: redis.Redis) -> None:
    r = redis_client
    r.xgroup_create(SUBMITTED, streams.VALIDATOR_GROUP, id="0", mkstream=True)
    r.xgroup_create(VERIFIED, streams.TRAINER_GROUP, id="0", mkstream=True)
    books, late = Books(), Books()
    for n in range(3):
        _settle(r, n)
    books.read(r)
    assert trim(r, SUBMITTED, exact=True) == trim(r, VERIFIED, exact=True) == 3
    for n in range(3, 5):
        _settle(r, n)

    closed = books.account(r, onchain_units=15)
    assert closed["rollouts"] == {
        "submitted": 5, "trained": 5, "rejected": 0, "expired": 0,
        "trained_twice": 0, "unaccounted": 0,
    }  # fmt: skip
    assert closed["validator_units"] == 15 and closed["trained_not_submitted"] == 0
    # Books that first look after the trim cannot balance, and say so rather than miscount.
    with pytest.raises(BooksGap, match="5 entries added, 2 read"):
        late.account(r, onchain_units=15)


def test_books_forget_an_entry_a_failover_took_back(redis_client: redis.Redis) -> None:
    r = redis_client
    kept = [r.xadd(SUBMITTED, streams.encode(submitted(n))).decode() for n in range(2)]
    books = Books()
    books.read(r)
    lost = r.xadd(SUBMITTED, streams.encode(submitted(2))).decode()
    books.read(r)
    assert books.counts()["submitted"] == 3
    # The promoted replica never had `lost`: the same stream without it (and its count).
    r.delete(SUBMITTED)
    for entry_id, n in zip(kept, range(2), strict=True):
        r.xadd(SUBMITTED, streams.encode(submitted(n)), id=entry_id)
    assert lost not in {e.decode() for e, _ in r.xrange(SUBMITTED)}
    books.read(r)
    assert books.counts()["submitted"] == 2


def test_books_name_the_items_where_chain_and_validators_differ(redis_client: redis.Redis) -> None:
    r = redis_client
    r.xgroup_create(SUBMITTED, streams.VALIDATOR_GROUP, id="0", mkstream=True)
    r.xgroup_create(VERIFIED, streams.TRAINER_GROUP, id="0", mkstream=True)
    for n in range(3):
        _settle(r, n)
    books = Books()
    books.account(r, onchain_units=9)
    worker = submitted(0).lease.worker
    on_chain = [Work(worker, 0, 3), Work(worker, 1, 4), Work(worker, 7, 3)]
    diff = books.chain_difference(on_chain)
    assert diff["only_on_chain"] == 1 and diff["only_on_chain_units"] == 3
    assert diff["only_verified"] == 1 and diff["only_verified_units"] == 3
    assert diff["units_differ"] == 1
    assert diff["examples"]["only_on_chain"] == [f"{worker.lower()}/7"]
