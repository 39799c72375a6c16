"""Pure helpers of libs/chain: amounts, revert reasons, anvil discovery."""

from __future__ import annotations

import argparse
import stat
from pathlib import Path

import pytest
from web3.exceptions import ContractLogicError

from prime_swarm.libs.chain import anvil
from prime_swarm.libs.chain.deployment import Deployment, load_deployment, write_deployment
from prime_swarm.libs.chain.errors import ChainError
from prime_swarm.libs.chain.transactions import revert_reason
from prime_swarm.libs.chain.units import parse_wei
from prime_swarm.services.chain.cli import amount, build_parser


@pytest.mark.parametrize(
    ("text", "wei"),
    [("0", 0), ("1000", 1000), ("2gwei", 2 * 10**9), ("0.5ether", 5 * 10**17), ("1 ETH", 10**18)],
)
def test_amounts(text: str, wei: int) -> None:
    assert amount(text) == wei


@pytest.mark.parametrize("text", ["", "-1", "1e18", "abc", "0.1wei", "1.0000000001gwei"])
def test_bad_amounts(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        amount(text)
    # The library's parser (the compose deployer's too) says the same as a ValueError.
    with pytest.raises(ValueError, match="amount"):
        parse_wei(text)


def test_every_command_has_help() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == {
        "address", "compile", "deploy", "create-pool", "set-orchestrator-url", "set-trainer",
        "register-validator", "add-validator", "remove-validator", "fund-pool", "pool-info",
        "balances", "activate-pool", "end-pool", "set-slash-policy", "pool-status",
        "worker-status",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("execution reverted: not a validator", "not a validator"),
        ("execution reverted", "reverted without reason"),
        ("out of gas", "out of gas"),
    ],
)
def test_revert_reason(message: str, reason: str) -> None:
    assert revert_reason(ContractLogicError(message)) == reason


def test_deployment_round_trip_and_errors(tmp_path: Path) -> None:
    d = Deployment(
        "http://x", 1, "0x" + "11" * 20, "0x" + "22" * 20, 3, "0xab", "SwarmLedger", 10, 7200, 1800
    )
    write_deployment(tmp_path / "d.json", d)
    assert load_deployment(tmp_path / "d.json") == d
    (tmp_path / "partial.json").write_text('{"rpc_url": "http://x"}')
    with pytest.raises(ChainError, match="lacks address, block"):
        load_deployment(tmp_path / "partial.json")


def test_find_anvil_prefers_the_env_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "anvil"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(anvil.ANVIL_BIN_ENV, str(fake))
    assert anvil.find_anvil() == fake

    monkeypatch.setenv(anvil.ANVIL_BIN_ENV, str(tmp_path / "missing"))
    with pytest.raises(anvil.AnvilError, match="not an executable file"):
        anvil.find_anvil()


def test_find_anvil_explains_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(anvil.ANVIL_BIN_ENV, raising=False)
    monkeypatch.setattr(anvil, "REPO_ANVIL", tmp_path / "nope")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(anvil.AnvilError, match="anvil not found"):
        anvil.find_anvil()


def test_dev_accounts_follow_the_dev_mnemonic() -> None:
    accounts = anvil.dev_accounts(2)
    # Anvil's (and Hardhat's) well-known first two dev accounts.
    assert [a.address for a in accounts] == [
        "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266",
        "0x70997970C51812dc3A010C7d01b50e0d17dc79C8",
    ]


def test_free_port_is_bindable() -> None:
    import socket

    port = anvil.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    assert 0 < port < 65536
