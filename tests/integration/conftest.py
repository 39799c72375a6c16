"""Shared fixtures for integration tests: real servers on free 127.0.0.1 ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from eth_account import Account
from eth_account.signers.local import LocalAccount

from prime_swarm.deploy.local.pool import (
    announce_placeholder_policy,
    create_pool,
    orchestrator_env,
    stake_member,
    start_orchestrator,
)
from prime_swarm.libs.chain.anvil import Anvil, AnvilError, find_anvil
from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.localnet.ports import free_port
from prime_swarm.libs.localnet.process import ManagedProcess


@pytest.fixture(scope="session")
def anvil() -> Iterator[Anvil]:
    """A running anvil dev chain for the whole session.

    Yields the `Anvil` handle: `.rpc_url`, `.chain_id` and `.dev_accounts(n)` (funded
    `LocalAccount`s derived from anvil's dev mnemonic). Tests deploy their own ledger on it
    (`libs.chain.deploy.deploy_ledger`) so they never see each other's pools.
    """
    try:
        find_anvil()
    except AnvilError as exc:
        pytest.fail(f"integration tests need anvil: {exc}", pytrace=False)
    with Anvil(accounts=20) as node:
        yield node


# --- a real orchestrator in front of a real pool ----------------------------------------


TRAINER = "0x" + "11" * 20
MIN_STAKE = 10**18


@dataclass
class LivePool:
    url: str
    pool_id: int
    owner: LocalAccount
    member: LocalAccount
    outsider: LocalAccount
    redis: redis.Redis
    rpc_url: str
    ledger: str
    process: ManagedProcess

    def restart(self) -> None:
        """kill -9 the orchestrator and start a new one on the same Redis, port and settings."""
        self.process.kill()
        self.process.stop()
        self.process = self.process.respawn()
        self.process.wait_http(f"{self.url}/healthz", timeout_s=30)

    def ledger_as(self, account: LocalAccount) -> LedgerClient:
        return LedgerClient(self.rpc_url, self.ledger, account=account, timeout=30)

    def new_member(self) -> LocalAccount:
        """A fresh funded key, staked at the minimum."""
        account = Account.create()
        stake_member(self.rpc_url, self.ledger, self.pool_id, account, MIN_STAKE)
        return account


@contextmanager
def live_pool(
    anvil: Anvil, redis_url: str, logs: Path, env: dict[str, str] | None = None
) -> Iterator[LivePool]:
    owner, member, outsider = anvil.dev_accounts(1)[0], Account.create(), Account.create()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # A short unbonding period, so tests can mine past it.
    ledger, pool_id = create_pool(anvil.rpc_url, owner, url, TRAINER, unbonding_blocks=20)
    announce_placeholder_policy(redis_url, version=5)
    stake_member(anvil.rpc_url, ledger, pool_id, member, MIN_STAKE)
    r = redis.Redis.from_url(redis_url)
    orchestrator = start_orchestrator(
        logs,
        {
            **orchestrator_env(port, redis_url, anvil.rpc_url, ledger, pool_id),
            # The group size is the pool's recipe, shared by every service.
            "PRIME_RECIPE_GROUP_SIZE": "2",
            "PRIME_ORCH_MAX_OPEN_LEASES_PER_WORKER": "3",
            **(env or {}),
        },
    )
    pool = LivePool(url, pool_id, owner, member, outsider, r, anvil.rpc_url, ledger, orchestrator)
    try:
        yield pool
    finally:
        # pool.process, not orchestrator: a test that restarted the orchestrator holds a new
        # one, and stopping the first left the second running after every `make test`.
        pool.process.stop()
        r.close()


@pytest.fixture(scope="session")
def start_live_pool() -> Callable[..., AbstractContextManager[LivePool]]:
    """`with start_live_pool(anvil, redis_url, logs, env) as pool:` a real orchestrator process
    in front of a fresh ledger on anvil, with a staked member and an announced policy."""
    return live_pool
