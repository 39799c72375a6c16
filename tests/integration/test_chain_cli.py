"""`prime-chain` as a user runs it: a real subprocess against the session's anvil."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prime_swarm.libs.chain.anvil import Anvil, free_port
from prime_swarm.libs.chain.client import LedgerClient


def prime_chain(
    *args: str, env: dict[str, str] | None = None, ok: bool = True
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "prime_swarm.libs.chain.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_deploy_create_pool_and_inspect(anvil: Anvil, tmp_path: Path) -> None:
    owner, validator, worker = anvil.dev_accounts(3)
    record = tmp_path / "deployment.json"
    address = prime_chain(
        "deploy", "--rpc-url", anvil.rpc_url, "--dev-account", "0", "--out", str(record)
    ).stdout.strip()
    deployment = json.loads(record.read_text())
    assert deployment["address"] == address
    assert deployment["chain_id"] == anvil.chain_id
    assert deployment["deployer"] == owner.address

    # The owner's key through the environment, as an operator would pass it.
    owner_env = {"PRIME_CHAIN_PRIVATE_KEY": owner.key.to_0x_hex()}
    common = ("--deployment", str(record))
    pool = prime_chain(
        "create-pool", *common, "--orchestrator-url", "http://orch.test:8000",
        "--min-stake", "0.5ether", "--reward-per-unit", "2gwei", env=owner_env,
    ).stdout.strip()  # fmt: skip
    assert pool == "1"

    prime_chain(
        "register-validator", *common, "--pool", pool, "--validator", validator.address,
        env=owner_env,
    )  # fmt: skip
    funds = prime_chain("fund-pool", *common, "--pool", pool, "--amount", "3ether", env=owner_env)
    assert funds.stdout.strip() == str(3 * 10**18)

    info = json.loads(prime_chain("pool-info", *common, "--pool", pool).stdout)
    assert info == {
        "pool_id": 1,
        "owner": owner.address,
        "orchestrator_url": "http://orch.test:8000",
        "min_stake": 5 * 10**17,
        "reward_per_unit": 2 * 10**9,
        "funds": 3 * 10**18,
        "total_attested_units": 0,
    }

    client = LedgerClient.from_deployment(record, worker)
    client.join(1, 10**18)
    balances = json.loads(
        prime_chain("balances", *common, "--pool", pool, "--worker", worker.address).stdout
    )
    assert balances["is_member"] is True
    assert balances["stake"] == 10**18
    assert balances["reward_balance"] == 0
    assert LedgerClient.from_deployment(record).is_validator(1, validator.address)


def test_key_file_is_created_and_reused(anvil: Anvil, tmp_path: Path) -> None:
    key_file = tmp_path / "keys" / "operator.json"
    out = tmp_path / "d.json"
    # A fresh key has no ether: the deploy fails, clearly, but the key file stays for reuse.
    failed = prime_chain(
        "deploy", "--rpc-url", anvil.rpc_url, "--key-file", str(key_file), "--out", str(out),
        ok=False,
    )  # fmt: skip
    assert failed.returncode == 1
    assert "insufficient funds" in failed.stderr.lower()
    assert key_file.stat().st_mode & 0o777 == 0o600
    first = json.loads(key_file.read_text())["address"]
    assert not out.exists()

    # Fund it, and the same file now deploys as the same address.
    LedgerClient.from_deployment  # noqa: B018 - keep the import used when the test is trimmed
    anvil_funder = anvil.dev_accounts(1)[0]
    from prime_swarm.libs.chain.transactions import make_web3

    w3 = make_web3(anvil.rpc_url)
    tx = {
        "to": first, "value": 10**18, "gas": 21_000, "gasPrice": w3.eth.gas_price * 2,
        "nonce": w3.eth.get_transaction_count(anvil_funder.address, "pending"),
        "chainId": anvil.chain_id,
    }  # fmt: skip
    signed = anvil_funder.sign_transaction(tx)
    w3.eth.wait_for_transaction_receipt(w3.eth.send_raw_transaction(signed.raw_transaction))
    prime_chain(
        "deploy", "--rpc-url", anvil.rpc_url, "--key-file", str(key_file), "--out", str(out)
    )
    assert json.loads(out.read_text())["deployer"] == first


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["create-pool", "--deployment", "d.json", "--orchestrator-url", "u", "--min-stake",
          "lots", "--reward-per-unit", "1"], 2, "invalid amount 'lots'"),
        (["balances", "--deployment", "d.json", "--pool", "1", "--worker", "0xnope"], 2,
         "invalid address '0xnope'"),
        (["pool-info", "--deployment", "missing.json", "--pool", "1"], 1,
         "deployment file missing.json does not exist"),
        (["deploy", "--rpc-url", "RPC", "--out", "d.json"], 1, "give exactly one of --key-file"),
        (["deploy", "--rpc-url", "RPC", "--private-key", "0x12", "--out", "d.json"], 1,
         "not a valid 32-byte hex key"),
    ],
)  # fmt: skip
def test_bad_input_is_a_clear_error(
    args: list[str], code: int, message: str, anvil: Anvil, tmp_path: Path
) -> None:
    args = [anvil.rpc_url if a == "RPC" else a for a in args]
    proc = subprocess.run(
        [sys.executable, "-m", "prime_swarm.libs.chain.cli", *args],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == code
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_chain_errors_name_the_problem(anvil: Anvil, tmp_path: Path) -> None:
    record = tmp_path / "deployment.json"
    prime_chain("deploy", "--rpc-url", anvil.rpc_url, "--dev-account", "0", "--out", str(record))
    unknown = prime_chain("pool-info", "--deployment", str(record), "--pool", "7", ok=False)
    assert unknown.returncode == 1
    assert "unknown pool" in unknown.stderr

    prime_chain(
        "create-pool", "--deployment", str(record), "--orchestrator-url", "http://o.test",
        "--min-stake", "1", "--reward-per-unit", "1", "--dev-account", "0",
    )  # fmt: skip
    not_owner = prime_chain(
        "register-validator", "--deployment", str(record), "--pool", "1",
        "--validator", anvil.dev_accounts(2)[1].address, "--dev-account", "1", ok=False,
    )  # fmt: skip
    assert not_owner.returncode == 1
    assert "not the pool owner" in not_owner.stderr

    down = f"http://127.0.0.1:{free_port()}"
    offline = prime_chain(
        "pool-info", "--deployment", str(record), "--rpc-url", down, "--pool", "1", ok=False
    )
    assert offline.returncode == 1
    assert "cannot reach the node" in offline.stderr
