"""Shared fixtures for integration tests: real servers on free 127.0.0.1 ports."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from eth_account import Account
from eth_account.signers.local import LocalAccount

from prime_swarm.libs.chain.anvil import Anvil, AnvilError, find_anvil
from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.chain.deploy import deploy_ledger
from prime_swarm.libs.localnet.ports import free_port
from prime_swarm.libs.localnet.process import ManagedProcess
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import PolicyAnnouncement


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
        old = self.process
        self.process = ManagedProcess(old.name, old.argv, old.log_path.parent, old.env, old.cwd)
        self.process.wait_http(f"{self.url}/healthz", timeout_s=30)

    def ledger_as(self, account: LocalAccount) -> LedgerClient:
        return LedgerClient(self.rpc_url, self.ledger, account=account, timeout=30)

    def new_member(self) -> LocalAccount:
        """A fresh funded key, staked at the minimum."""
        account = Account.create()
        self.ledger_as(self.owner).w3.provider.make_request(
            "anvil_setBalance", [account.address, hex(5 * MIN_STAKE)]
        )
        self.ledger_as(account).join(self.pool_id, MIN_STAKE)
        return account


@contextmanager
def live_pool(
    anvil: Anvil, redis_url: str, logs: Path, env: dict[str, str] | None = None
) -> Iterator[LivePool]:
    owner, member, outsider = anvil.dev_accounts(1)[0], Account.create(), Account.create()
    # A short unbonding period, so tests can mine past it.
    ledger_addr = deploy_ledger(anvil.rpc_url, owner, unbonding_blocks=20).address
    port = free_port()
    pool_id = LedgerClient(anvil.rpc_url, ledger_addr, account=owner, timeout=30).create_pool(
        f"http://127.0.0.1:{port}", MIN_STAKE, 1, TRAINER
    )
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    r.xadd(
        streams.POLICY_ANNOUNCEMENTS,
        streams.encode(
            PolicyAnnouncement(
                version=5, step=5, model_hash="ab" * 32, manifest_path="/v1/versions/5/manifest"
            )
        ),
    )
    proc = ManagedProcess(
        "orchestrator",
        [sys.executable, "-m", "prime_swarm.services.orchestrator.cli"],
        logs,
        env={
            "PRIME_ORCH_PORT": str(port),
            "PRIME_ORCH_REDIS_URL": redis_url,
            "PRIME_ORCH_RPC_URL": anvil.rpc_url,
            "PRIME_ORCH_LEDGER_ADDRESS": ledger_addr,
            "PRIME_ORCH_POOL_ID": str(pool_id),
            "PRIME_ORCH_RELAYS": '["http://127.0.0.1:1"]',
            # The group size is the pool's recipe, shared by every service.
            "PRIME_RECIPE_GROUP_SIZE": "2",
            "PRIME_ORCH_MAX_OPEN_LEASES_PER_WORKER": "3",
            **(env or {}),
        },
        cwd=Path.cwd(),
    )
    url = f"http://127.0.0.1:{port}"
    pool = LivePool(url, pool_id, owner, member, outsider, r, anvil.rpc_url, ledger_addr, proc)
    try:
        pool.ledger_as(owner).w3.provider.make_request(
            "anvil_setBalance", [member.address, hex(5 * MIN_STAKE)]
        )
        pool.ledger_as(member).join(pool_id, MIN_STAKE)
        proc.wait_http(f"{url}/healthz", timeout_s=30)
        yield pool
    finally:
        # pool.process, not proc: a test that restarted the orchestrator holds a new one, and
        # stopping the first left the second running after every `make test`.
        pool.process.stop()
        r.close()


@pytest.fixture(scope="session")
def start_live_pool() -> Callable[..., AbstractContextManager[LivePool]]:
    """`with start_live_pool(anvil, redis_url, logs, env) as pool:` a real orchestrator process
    in front of a fresh ledger on anvil, with a staked member and an announced policy."""
    return live_pool
