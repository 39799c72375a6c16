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

from prime_swarm.deploy.local.pool import Pool, stake_member, start_pool
from prime_swarm.libs.chain.anvil import Anvil, AnvilError, find_anvil
from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.localnet.process import ManagedProcess
from prime_swarm.libs.streams.connection import connect


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
    """The pool `start_pool` brought up, with the accounts a test plays."""

    pool: Pool
    owner: LocalAccount
    member: LocalAccount
    outsider: LocalAccount
    redis: redis.Redis

    @property
    def url(self) -> str:
        return self.pool.url

    @property
    def pool_id(self) -> int:
        return self.pool.pool_id

    @property
    def rpc_url(self) -> str:
        return self.pool.rpc_url

    @property
    def ledger(self) -> str:
        return self.pool.ledger

    @property
    def process(self) -> ManagedProcess:
        assert self.pool.process is not None
        return self.pool.process

    def restart(self) -> None:
        """kill -9 the orchestrator and start a new one on the same Redis, port and settings."""
        self.pool.restart()

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
    # A short unbonding period, so tests can mine past it.
    with start_pool(
        logs, anvil.rpc_url, redis_url, owner, TRAINER,
        min_stake_wei=MIN_STAKE, unbonding_blocks=20, members=[member], placeholder_version=5,
        env={
            # The group size is the pool's recipe, shared by every service.
            "PRIME_RECIPE_GROUP_SIZE": "2",
            "PRIME_ORCH_MAX_OPEN_LEASES_PER_WORKER": "3",
            **(env or {}),
        },
    ) as pool:  # fmt: skip
        r = connect(redis_url, socket_timeout=10)
        try:
            yield LivePool(pool, owner, member, outsider, r)
        finally:
            r.close()


@pytest.fixture(scope="session")
def start_live_pool() -> Callable[..., AbstractContextManager[LivePool]]:
    """`with start_live_pool(anvil, redis_url, logs, env) as pool:` a real orchestrator process
    in front of a fresh ledger on anvil, with a staked member and an announced policy."""
    return live_pool
