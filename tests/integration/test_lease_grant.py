"""The lease rule and the answer to a lease, as the scripts run them in a real Redis
(services/orchestrator/state.py `_RESERVE_LEASES`, `_ADMIT`): the grant is the tightest of the
request, the worker's cap and the pool's budget, concurrent requests never overspend it, and an
answer is recorded once, its retry recognised."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from lease_books import lease_book, run
from redis.asyncio import Redis as AsyncRedis
from rollout_messages import submission_for

from prime_swarm.libs.localnet.redis_server import RedisServer
from prime_swarm.protocol import streams
from prime_swarm.services.orchestrator.state import ALL_OPEN_LEASES, Admission, LeaseBook

WORKERS = ["0x" + f"{i:02x}" * 20 for i in range(1, 41)]


@pytest.fixture
def flushed(redis_server: RedisServer) -> Iterator[str]:
    redis_server.client().flushall()
    yield redis_server.url


def book(r: AsyncRedis, max_in_flight: int = 64, ttl_s: float = 60.0) -> LeaseBook:
    return lease_book(r, max_in_flight_groups=max_in_flight, lease_ttl_s=ttl_s)


def test_grant_is_the_tightest_of_request_worker_cap_and_pool_budget(flushed: str) -> None:
    async def body(r: AsyncRedis) -> None:
        leases = book(r, max_in_flight=10)
        a, b = WORKERS[:2]
        assert len((await leases.issue(a, 1, 0, requested=8, cap=64))[0]) == 8
        assert len((await leases.issue(a, 1, 0, requested=8, cap=9))[0]) == 1  # its cap
        got, in_flight = await leases.issue(b, 1, 0, requested=8, cap=64)
        assert (len(got), in_flight) == (1, 9)  # the pool's budget
        assert (await leases.issue(b, 1, 0, requested=8, cap=64))[0] == []
        assert await leases.in_flight() == 10
        # Work waiting for a validator counts too: the budget is what the trainer will see.
        await r.xgroup_create(streams.ROLLOUTS_SUBMITTED, streams.VALIDATOR_GROUP, mkstream=True)
        await r.zrem(ALL_OPEN_LEASES, *[lease.lease_id for lease in got])
        await r.xadd(streams.ROLLOUTS_SUBMITTED, {"m": "x"})
        assert await leases.in_flight() == 10
        await r.xadd(streams.ROLLOUTS_SUBMITTED, {"m": "x"})
        assert await leases.in_flight() == 11

    run(flushed, body)


def test_concurrent_requests_never_overspend_the_budget(flushed: str) -> None:
    """40 workers asking at once, each for up to 8, against a budget of 100 with a cap of 6."""

    async def body(r: AsyncRedis) -> None:
        leases = book(r, max_in_flight=100)
        rounds = await asyncio.gather(
            *(leases.issue(w, 1, 0, requested=8, cap=6) for w in WORKERS for _ in range(3))
        )
        granted = [lease for got, _ in rounds for lease in got]
        assert len(granted) == 100
        per_worker: dict[str, int] = {}
        for lease in granted:
            per_worker[lease.worker] = per_worker.get(lease.worker, 0) + 1
        assert max(per_worker.values()) <= 6
        assert len({lease.lease_id for lease in granted}) == 100
        assert await leases.in_flight() == 100

    run(flushed, body)


def test_an_answer_is_recorded_once_and_its_retry_recognised(flushed: str) -> None:
    async def body(r: AsyncRedis) -> None:
        leases = book(r)
        await r.xgroup_create(streams.ROLLOUTS_SUBMITTED, streams.VALIDATOR_GROUP, mkstream=True)
        (lease,), _ = await leases.issue(WORKERS[0], 1, 0, requested=1, cap=8)
        entry = submission_for(lease)
        assert (await leases.admit(entry))[0] == Admission.ADMITTED
        assert (await leases.admit(entry))[0] == Admission.ADMITTED_BEFORE
        other = entry.model_copy(update={"submission_id": "f" * 32})
        assert (await leases.admit(other))[0] == Admission.DUPLICATE
        assert await r.xlen(streams.ROLLOUTS_SUBMITTED) == 1
        assert await leases.in_flight() == 1  # answered: no longer open, now awaiting validation

    run(flushed, body)


def test_an_answer_after_expiry_is_refused(flushed: str) -> None:
    async def body(r: AsyncRedis) -> None:
        leases = book(r, ttl_s=0.2)
        (lease,), _ = await leases.issue(WORKERS[0], 1, 0, requested=1, cap=8)
        time.sleep(0.3)
        assert (await leases.admit(submission_for(lease)))[0] == Admission.EXPIRED
        assert await r.xlen(streams.ROLLOUTS_SUBMITTED) == 0

    run(flushed, body)


def test_work_counted_as_waiting_is_what_the_group_has_not_read(flushed: str) -> None:
    """XINFO's `lag` comes from a counter a failover can leave wrong (seen: 90 entries "waiting"
    of a group that had read them all, the budget full, the pool idle); the grant counts the
    entries after the group's last-delivered id instead."""

    async def body(r: AsyncRedis) -> None:
        leases = book(r, max_in_flight=10)
        for _ in range(5):
            await r.xadd(streams.ROLLOUTS_SUBMITTED, {"m": "x"})
        await r.xgroup_create(streams.ROLLOUTS_SUBMITTED, streams.VALIDATOR_GROUP, id="0")
        assert await leases.in_flight() == 5  # none read yet
        # All read and acknowledged, but the group's read counter says none were.
        await r.execute_command(
            "XGROUP", "SETID", streams.ROLLOUTS_SUBMITTED, streams.VALIDATOR_GROUP, "$",
            "ENTRIESREAD", 0,
        )  # fmt: skip
        groups = await r.xinfo_groups(streams.ROLLOUTS_SUBMITTED)
        assert int(groups[0]["lag"]) == 5  # what XINFO would have counted
        assert await leases.in_flight() == 0
        assert len((await leases.issue(WORKERS[0], 1, 0, requested=8, cap=64))[0]) == 8

    run(flushed, body)
