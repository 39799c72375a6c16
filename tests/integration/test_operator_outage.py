"""The operator's outage costs contributors nothing (real orchestrator, Redis and anvil): silence
that the pool could not have heard, or that is correlated, ejects nobody; a worker that lost its
registration or its membership gets it back by itself, or stops with one line."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from ejecting import ejecting_env
from eth_account.signers.local import LocalAccount

from prime_swarm.libs.chain.anvil import Anvil
from prime_swarm.libs.localnet.redis_server import RedisServer
from prime_swarm.protocol.messages import Heartbeat, RegisterRequest
from prime_swarm.services.orchestrator.state import LIVE_WORKERS, WORKERS
from prime_swarm.services.worker.client import OrchestratorClient
from prime_swarm.services.worker.onboarding import JoinError, rejoin
from prime_swarm.services.worker.runner import Outage, Worker
from prime_swarm.services.worker.settings import WorkerSettings
from prime_swarm.services.worker.status_line import Snapshot

StartPool = Callable[..., AbstractContextManager[Any]]
EJECT_AFTER_S = 2.0


@contextmanager
def ejecting_pool(
    anvil: Anvil, redis_server: RedisServer, tmp_path: Path, start_live_pool: StartPool
) -> Iterator[Any]:
    """A live pool whose orchestrator ejects, with the owner's key, after EJECT_AFTER_S."""
    env = ejecting_env(anvil, tmp_path, EJECT_AFTER_S)
    with start_live_pool(anvil, redis_server.url, tmp_path, env) as live:
        yield live


class Contributor:
    def __init__(self, live: Any, account: LocalAccount) -> None:  # noqa: ANN401
        self.live, self.account = live, account
        self.client = OrchestratorClient(live.url, account, timeout_s=10, retry_budget=0)

    def register(self) -> None:
        self.client.register(
            RegisterRequest(worker=self.account.address, pool_id=self.live.pool_id)
        )

    def heartbeat(self) -> None:
        self.client.heartbeat(Heartbeat(worker=self.account.address, pool_id=self.live.pool_id))


class Beating:
    """Heartbeats from a thread while the test does something else."""

    def __init__(self, *who: Contributor) -> None:
        self.who, self.stop = who, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.3):
            for c in self.who:
                c.heartbeat()

    def __enter__(self) -> Beating:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)


def members(live: Any, accounts: list[LocalAccount]) -> list[bool]:  # noqa: ANN401
    ledger = live.ledger_as(live.owner)
    return [ledger.is_member(live.pool_id, a.address) for a in accounts]


def wait_ejected(live: Any, account: LocalAccount, timeout_s: float = 30) -> None:  # noqa: ANN401
    deadline = time.monotonic() + timeout_s
    while members(live, [account]) == [True]:
        assert time.monotonic() < deadline, live.process.tail()
        time.sleep(0.3)


def test_every_worker_silent_past_eject_after_ejects_nobody_and_they_resume(
    anvil: Anvil, redis_server: RedisServer, tmp_path: Path, start_live_pool: StartPool
) -> None:
    with ejecting_pool(anvil, redis_server, tmp_path, start_live_pool) as live:
        accounts = [live.member, live.new_member()]
        workers = [Contributor(live, a) for a in accounts]
        for w in workers:
            w.register()
        # The orchestrator's region cut off from its contributors: nobody heard, for three
        # times eject_after_s and many ejection rounds.
        time.sleep(3 * EJECT_AFTER_S + 1)
        assert members(live, accounts) == [True, True], live.process.tail()
        assert "workers silent at once" in live.process.tail()
        for w in workers:  # back: no registration needed, nothing to mend
            w.heartbeat()
        # The ejector was on all along: one worker silent while the other beats is ejected.
        with Beating(workers[1]):
            wait_ejected(live, accounts[0])
        assert members(live, accounts) == [False, True]


def test_orchestrators_down_past_eject_after_eject_nobody_who_comes_back(
    anvil: Anvil, redis_server: RedisServer, tmp_path: Path, start_live_pool: StartPool
) -> None:
    with ejecting_pool(anvil, redis_server, tmp_path, start_live_pool) as live:
        accounts = [live.member, live.new_member(), live.new_member()]
        workers = [Contributor(live, a) for a in accounts]
        for w in workers:
            w.register()
        time.sleep(1.0)  # a few rounds of listening before the outage
        live.pool.processes[0].kill()
        live.pool.processes[0].stop()
        time.sleep(3 * EJECT_AFTER_S)  # every replica down: nobody can be heard
        live.pool.start()
        # Two come back at once; the third only after half of eject_after_s (its own backoff):
        # one silent worker of three is no correlated silence, but the pool had not listened
        # long enough to blame it.
        with Beating(*workers[:2]):
            time.sleep(EJECT_AFTER_S / 2)
            workers[2].heartbeat()
            with Beating(workers[2]):
                time.sleep(2 * EJECT_AFTER_S)
                assert members(live, accounts) == [True, True, True], live.process.tail()
            assert "has listened for only" in live.process.tail()
            wait_ejected(live, accounts[2])  # silent now, with the pool listening: ejected
        assert members(live, accounts) == [True, True, False]


def ejected_member(live: Any) -> LocalAccount:  # noqa: ANN401
    """The pool's member, registered, then silent while another member beats: ejected."""
    gone, other = live.member, live.new_member()
    Contributor(live, gone).register()
    with Beating(Contributor(live, other)):
        Contributor(live, other).register()
        wait_ejected(live, gone)
    return gone


def worker_of(live: Any, account: LocalAccount, tmp_path: Path, **settings: Any) -> Worker:  # noqa: ANN401
    s = WorkerSettings(
        pool_id=live.pool_id,
        rpc_url=live.rpc_url,
        ledger_address=live.ledger,
        key_file=tmp_path / "unused-key.json",
        cache_dir=tmp_path / "cache",
        **settings,
    )
    ledger = live.ledger_as(account)
    # No backend: registration never generates.
    return Worker(
        s,
        account,
        backend=None,  # type: ignore[arg-type]
        orchestrator_url=live.url,
        trusted_trainer="0x" + "11" * 20,
        rejoin=lambda: rejoin(ledger, s, account.address),
    )


def test_an_ejected_worker_rejoins_on_its_unbonding_stake_and_registers_by_itself(
    anvil: Anvil, redis_server: RedisServer, tmp_path: Path, start_live_pool: StartPool
) -> None:
    with ejecting_pool(anvil, redis_server, tmp_path, start_live_pool) as live:
        gone = ejected_member(live)
        assert not live.redis.hexists(WORKERS, gone.address.lower())
        worker = worker_of(live, gone, tmp_path)
        client = OrchestratorClient(live.url, gone, timeout_s=10, retry_budget=0)
        # Refused as not a member; rejoined on chain with the stake still unbonding (gas
        # only); registered: on the roster and live again.
        assert worker._register(client, Outage(30, Snapshot()))
        assert members(live, [gone]) == [True]
        assert live.redis.hexists(WORKERS, gone.address.lower())
        assert live.redis.zscore(LIVE_WORKERS, gone.address.lower()) is not None


def test_an_ejected_worker_that_cannot_rejoin_for_free_stops_with_one_line(
    anvil: Anvil, redis_server: RedisServer, tmp_path: Path, start_live_pool: StartPool
) -> None:
    with ejecting_pool(anvil, redis_server, tmp_path, start_live_pool) as live:
        gone = ejected_member(live)
        ledger = live.ledger_as(gone)
        ledger.w3.provider.make_request("anvil_mine", [hex(25)])  # past the unbonding period
        ledger.withdraw(live.pool_id)  # the stake paid out: rejoining needs a new one
        worker = worker_of(live, gone, tmp_path)  # no --yes: it may not stake by itself
        client = OrchestratorClient(live.url, gone, timeout_s=10, retry_budget=0)
        with pytest.raises(JoinError) as err:
            worker._register(client, Outage(30, Snapshot()))
        line = str(err.value)
        assert "\n" not in line and "run `prime-worker join` again" in line, line
        assert "1 ETH more stake" in line or "more stake" in line, line
        assert members(live, [gone]) == [False]


def test_a_worker_whose_registration_keeps_vanishing_stops_instead_of_spinning(
    anvil: Anvil, redis_server: RedisServer, tmp_path: Path, start_live_pool: StartPool
) -> None:
    with ejecting_pool(anvil, redis_server, tmp_path, start_live_pool) as live:
        worker = worker_of(live, live.member, tmp_path)
        client = OrchestratorClient(live.url, live.member, timeout_s=10, retry_budget=0)
        outage = Outage(30, Snapshot())
        for _ in range(5):
            assert worker._register(client, outage)
        with pytest.raises(JoinError, match="registered 5 times in 600 s"):
            worker._register(client, outage)
