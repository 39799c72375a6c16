"""Lease scheduling against a real orchestrator, Redis and anvil: the in-flight budget spread
over workers, expired leases reissued, silent workers ejected on chain, and a restarted
orchestrator carrying on from Redis."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from ejecting import ejecting_env
from rollout_messages import answer

from prime_swarm.libs.chain.anvil import Anvil
from prime_swarm.libs.localnet.redis_server import RedisServer
from prime_swarm.protocol.messages import (
    Heartbeat,
    Lease,
    LeaseRequest,
    RegisterRequest,
    normal_address,
)
from prime_swarm.services.orchestrator.state import EJECTED, REISSUED
from prime_swarm.services.worker.client import OrchestratorClient, OrchestratorError

StartPool = Callable[..., AbstractContextManager[Any]]


class Contributor:
    """A worker's signed client, registered with the pool."""

    def __init__(self, live: Any, account: Any, register: bool = True) -> None:  # noqa: ANN401
        self.live, self.address = live, account.address
        self.client = OrchestratorClient(live.url, account, timeout_s=10, retry_budget=0)
        if register:
            self.client.register(RegisterRequest(worker=self.address, pool_id=live.pool_id))

    def lease(self, count: int) -> list[Lease]:
        req = LeaseRequest(
            worker=self.address, pool_id=self.live.pool_id, policy_version=5, count=count
        )
        return self.client.lease(req).leases

    def heartbeat(self) -> None:
        hb = Heartbeat(worker=self.address, pool_id=self.live.pool_id)
        self.client.heartbeat(hb)

    def submit(self, lease: Lease) -> str:
        return self.client.submit(answer(lease)).submission_id


def test_the_in_flight_budget_is_spread_over_live_workers(
    anvil: Anvil, redis_server: RedisServer, tmp_path: Path, start_live_pool: StartPool
) -> None:
    env = {
        "PRIME_ORCH_MAX_IN_FLIGHT_GROUPS": "6",
        "PRIME_ORCH_MAX_OPEN_LEASES_PER_WORKER": "64",
        "PRIME_ORCH_LEASE_SPREAD": "1.0",
    }
    with start_live_pool(anvil, redis_server.url, tmp_path, env) as live:
        clients = [Contributor(live, live.member)] + [
            Contributor(live, live.new_member()) for _ in "ab"
        ]
        # Three live workers share six groups: the first to ask cannot take them all.
        assert len(clients[0].lease(8)) == 2
        assert len(clients[0].lease(8)) == 0
        assert len(clients[1].lease(8)) == 2
        assert len(clients[2].lease(8)) == 2
        assert len(clients[2].lease(8)) == 0  # and the pool's budget is spent


def test_an_expired_lease_is_reissued_and_its_late_answer_refused(
    anvil: Anvil, redis_server: RedisServer, tmp_path: Path, start_live_pool: StartPool
) -> None:
    env = {"PRIME_ORCH_LEASE_TTL_S": "1", "PRIME_ORCH_MAX_OPEN_LEASES_PER_WORKER": "64"}
    with start_live_pool(anvil, redis_server.url, tmp_path, env) as live:
        crashed, other = Contributor(live, live.member), Contributor(live, live.new_member())
        lost = crashed.lease(2)
        time.sleep(1.2)  # the worker crashed: its leases expire unanswered
        again = other.lease(3)
        # The expired tasks come first, under new lease ids, to the worker who asked.
        assert {(x.task_id, x.prompt) for x in again[:2]} == {(x.task_id, x.prompt) for x in lost}
        assert {x.lease_id for x in again}.isdisjoint(x.lease_id for x in lost)
        assert {x.worker for x in again} == {normal_address(other.address)}
        assert again[2].task_id not in {x.task_id for x in lost}  # then the stream goes on
        assert int(live.redis.get(REISSUED)) == 2
        with pytest.raises(OrchestratorError) as err:
            crashed.submit(lost[0])
        assert err.value.status == 410 and err.value.reason == "lease_expired"
        # Reissued once only: the next request gets fresh tasks.
        assert {x.task_id for x in other.lease(3)}.isdisjoint(x.task_id for x in lost)
        assert other.submit(again[0])


def test_a_silent_worker_is_ejected_on_chain_with_the_owners_key(
    anvil: Anvil, redis_server: RedisServer, tmp_path: Path, start_live_pool: StartPool
) -> None:
    env = ejecting_env(anvil, tmp_path, 2)
    with start_live_pool(anvil, redis_server.url, tmp_path, env) as live:
        silent, alive = live.member, live.new_member()
        Contributor(live, silent)
        beating = Contributor(live, alive)
        ledger = live.ledger_as(live.owner)
        start = ledger.block_number()
        deadline = time.monotonic() + 30
        while ledger.is_member(live.pool_id, silent.address):
            assert time.monotonic() < deadline, live.process.tail()
            beating.heartbeat()
            time.sleep(0.3)
        [event] = ledger.events("WorkerEjected", from_block=start, pool_id=live.pool_id)
        assert event["args"]["worker"] == silent.address
        assert event["args"]["reason"] == "no heartbeat for 2 s"
        assert ledger.stake_of(live.pool_id, silent.address) == event["args"]["stake"] > 0
        assert ledger.is_member(live.pool_id, alive.address)  # heartbeats keep a worker in
        # The record lands in Redis just after the transaction is mined.
        while (raw := live.redis.hget(EJECTED, silent.address.lower())) is None:
            assert time.monotonic() < deadline, live.process.tail()
            time.sleep(0.1)
        record = json.loads(raw)
        assert record["tx"] == event["transactionHash"].to_0x_hex()
        # An ejected worker gets no more work.
        with pytest.raises(OrchestratorError) as err:
            Contributor(live, silent, register=False).lease(1)
        assert err.value.status == 403


def test_a_restarted_orchestrator_carries_on_with_the_same_workers_and_leases(
    anvil: Anvil, redis_server: RedisServer, tmp_path: Path, start_live_pool: StartPool
) -> None:
    with start_live_pool(anvil, redis_server.url, tmp_path) as live:
        c = Contributor(live, live.member)
        held = c.lease(2)
        live.restart()  # kill -9: nothing is flushed, everything lives in Redis
        # No new registration: the worker, its open leases and the task stream are all there.
        c.heartbeat()
        first = c.submit(held[0])
        assert c.submit(held[0]) == first  # a retry of the same answer: the same admission
        (fresh,) = c.lease(1)  # max 3 open per worker: one still open, one more granted
        assert fresh.task_id not in {x.task_id for x in held}
        assert c.submit(held[1])
