"""Joining a pool against a real anvil chain: every check before staking fails with one line
naming the flag to change, and nothing is staked unless everything answered and the contributor
agreed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from prime_swarm.libs.chain.anvil import Anvil
from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.chain.deploy import deploy_ledger
from prime_swarm.libs.chain.keyfile import is_encrypted
from prime_swarm.libs.localnet.ports import free_port
from prime_swarm.services.worker.onboarding import (
    JoinError,
    check_orchestrator,
    read_standing,
    stake_if_needed,
)
from prime_swarm.services.worker.settings import WorkerChainSettings

ETH = 10**18
TRAINER = "0x" + "7e" * 20


class Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.send_response(200 if self.path == "/healthz" else 404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@dataclass
class Chain:
    rpc_url: str
    ledger: str
    owner: LedgerClient
    live_pool: int  # its orchestrator answers
    dead_pool: int  # its orchestrator's port is closed

    def settings(self, pool: int, **kw: object) -> WorkerChainSettings:
        fields = {"pool_id": pool, "rpc_url": self.rpc_url, "ledger_address": self.ledger}
        return WorkerChainSettings(**(fields | kw))

    def funded(self, wei: int) -> LocalAccount:
        account = Account.create()
        self.owner.w3.provider.make_request("anvil_setBalance", [account.address, hex(wei)])
        return account

    def as_(self, account: LocalAccount) -> LedgerClient:
        return LedgerClient(self.rpc_url, self.ledger, account=account, timeout=10)


@pytest.fixture(scope="module")
def chain(anvil: Anvil) -> Iterator[Chain]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Healthy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    owner_account = anvil.dev_accounts(1)[0]
    ledger = deploy_ledger(anvil.rpc_url, owner_account, unbonding_blocks=5).address
    owner = LedgerClient(anvil.rpc_url, ledger, account=owner_account, timeout=10)
    live = owner.create_pool(f"http://127.0.0.1:{server.server_port}", ETH, 1, TRAINER)
    dead = owner.create_pool(f"http://127.0.0.1:{free_port()}", ETH, 1, TRAINER)
    yield Chain(anvil.rpc_url, ledger, owner, live, dead)
    server.shutdown()


def test_a_dead_orchestrator_is_found_before_anything_is_staked(chain: Chain) -> None:
    worker = chain.funded(5 * ETH)
    ledger = chain.as_(worker)
    standing = read_standing(ledger, chain.settings(chain.dead_pool), worker.address)
    assert standing.balance == 5 * ETH and not standing.member
    with pytest.raises(JoinError, match="does not answer.*nothing was staked") as err:
        check_orchestrator(standing.pool, timeout_s=2)
    assert "\n" not in str(err.value)
    assert ledger.balance_of(worker.address) == 5 * ETH
    check_orchestrator(
        read_standing(ledger, chain.settings(chain.live_pool), "0x" + "00" * 20).pool, 2
    )


@pytest.mark.parametrize(
    ("change", "flag"),
    [
        ({"pool_id": 999}, "--pool (PRIME_WORKER_POOL_ID)"),
        ({"ledger_address": "0x" + "12" * 20}, "--ledger (PRIME_WORKER_LEDGER_ADDRESS)"),
        ({"rpc_url": f"http://127.0.0.1:{free_port()}"}, "--rpc-url (PRIME_WORKER_RPC_URL)"),
    ],
)
def test_each_wrong_setting_is_named(chain: Chain, change: dict, flag: str) -> None:
    worker = chain.funded(ETH)
    settings = chain.settings(chain.live_pool, **change)
    ledger = LedgerClient(settings.rpc_url, settings.ledger_address, account=worker, timeout=3)
    with pytest.raises(JoinError) as err:
        read_standing(ledger, settings, worker.address)
    assert flag in str(err.value) and "\n" not in str(err.value)


def test_staking_needs_funds_and_consent(chain: Chain) -> None:
    poor = chain.funded(ETH // 2)
    standing = read_standing(chain.as_(poor), chain.settings(chain.live_pool), poor.address)
    with pytest.raises(JoinError, match=r"holds 0\.5 ETH.*needs 1 ETH plus gas"):
        stake_if_needed(chain.as_(poor), standing, confirm=lambda q: True)

    worker = chain.funded(3 * ETH)
    ledger = chain.as_(worker)
    standing = read_standing(ledger, chain.settings(chain.live_pool), worker.address)
    asked: list[str] = []
    with pytest.raises(JoinError, match="not confirmed.*--yes"):
        stake_if_needed(ledger, standing, confirm=lambda q: asked.append(q) or False)
    assert "Stake 1 ETH into pool" in asked[0]
    assert not ledger.is_member(chain.live_pool, worker.address)

    assert stake_if_needed(ledger, standing, confirm=lambda q: True)
    standing = read_standing(ledger, chain.settings(chain.live_pool), worker.address)
    assert standing.member and standing.stake == ETH
    assert not stake_if_needed(ledger, standing, confirm=lambda q: False)  # already in: no question


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from prime_swarm.services.worker.cli import main

    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_join_from_the_command_line_stakes_nothing_until_it_may(
    chain: Chain,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    key = tmp_path / "worker-key.json"
    flags = ["--rpc-url", chain.rpc_url, "--ledger", chain.ledger, "--key-file", str(key)]
    # No terminal and no passphrase: one line naming both ways to give one, nothing written.
    monkeypatch.delenv("PRIME_WORKER_PASSPHRASE", raising=False)
    code, _, err = run_cli(["address", "--key-file", str(key)], capsys)
    assert code == 2 and "PRIME_WORKER_PASSPHRASE" in err and "--key-file" in err
    assert len(err.strip().splitlines()) == 1 and not key.exists()

    monkeypatch.setenv("PRIME_WORKER_PASSPHRASE", "a long passphrase")
    code, address, _ = run_cli(["address", "--key-file", str(key)], capsys)
    assert code == 0 and is_encrypted(key)
    address = address.strip()
    chain.owner.w3.provider.make_request("anvil_setBalance", [address, hex(3 * ETH)])

    # Without --yes and without a terminal to ask in, nothing is spent.
    code, _, err = run_cli(["join", "--pool", str(chain.live_pool), *flags], capsys)
    assert code == 1 and "pass --yes" in err and len(err.strip().splitlines()) == 1
    # The orchestrator is down: found before staking.
    code, _, err = run_cli(["join", "--pool", str(chain.dead_pool), "--yes", *flags], capsys)
    assert code == 1 and "nothing was staked" in err and len(err.strip().splitlines()) == 1
    assert chain.as_(chain.funded(0)).balance_of(address) == 3 * ETH
    assert not chain.owner.is_member(chain.dead_pool, address)

    code, out, _ = run_cli(["status", "--pool", str(chain.live_pool), *flags], capsys)
    assert code == 0 and "balance 3 ETH" in out and "not staked (minimum 1 ETH" in out
    code, _, err = run_cli(["leave", "--pool", str(chain.live_pool), *flags], capsys)
    assert code == 1 and "not staked" in err and "Traceback" not in err
    monkeypatch.setenv("PRIME_WORKER_PASSPHRASE", "wrong")
    code, _, err = run_cli(["status", "--pool", str(chain.live_pool), *flags], capsys)
    assert code == 2 and "wrong passphrase" in err
