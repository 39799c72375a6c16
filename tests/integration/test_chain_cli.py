"""`prime-chain` against the session's anvil.

One test runs the installed console script as a user would; the rest call `main(argv)` in this
process, which exercises the same parsing and handlers without paying ~1.5 s of imports per
command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prime_swarm.libs.chain.anvil import Anvil, free_port
from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.chain.deployment import DEFAULT_UNBONDING_BLOCKS
from prime_swarm.libs.chain.transactions import make_web3
from prime_swarm.services.chain.cli import main

Run = tuple[int, str, str]
TRAINER = "0x" + "7e" * 20


def _console_script() -> list[str]:
    script = Path(sys.executable).with_name("prime-chain")
    return (
        [str(script)]
        if script.exists()
        else [sys.executable, "-m", "prime_swarm.services.chain.cli"]
    )


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> Run:
    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse refuses bad arguments by exiting 2
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def ok(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    return out.strip()


def test_console_script_deploys_creates_a_pool_and_refuses_bad_input(
    anvil: Anvil, tmp_path: Path
) -> None:
    record = tmp_path / "deployment.json"
    owner_key = anvil.dev_accounts(1)[0].key.to_0x_hex()
    env = {**os.environ, "PRIME_CHAIN_PRIVATE_KEY": owner_key}

    def script(*args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [*_console_script(), *args], capture_output=True, text=True, timeout=60, env=env
        )
        assert "Traceback" not in proc.stderr
        return proc

    deploy = script("deploy", "--rpc-url", anvil.rpc_url, "--out", str(record))
    assert deploy.returncode == 0, deploy.stderr
    assert deploy.stdout.strip() == json.loads(record.read_text())["address"]
    assert json.loads(record.read_text())["unbonding_blocks"] == DEFAULT_UNBONDING_BLOCKS

    create = script(
        "create-pool", "--deployment", str(record), "--orchestrator-url", "http://orch.test",
        "--min-stake", "1ether", "--reward-per-unit", "1gwei", "--trainer", TRAINER,
    )  # fmt: skip
    assert create.returncode == 0, create.stderr
    assert create.stdout.strip() == "1"

    bad = script(
        "create-pool", "--deployment", str(record), "--orchestrator-url", "http://orch.test",
        "--min-stake", "plenty", "--reward-per-unit", "1", "--trainer", TRAINER,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "argument --min-stake: invalid amount 'plenty'" in bad.stderr


def test_deploy_create_pool_and_inspect(
    anvil: Anvil,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    owner, validator, worker, trainer = anvil.dev_accounts(4)
    record = tmp_path / "deployment.json"
    address = ok(
        capsys, "deploy", "--rpc-url", anvil.rpc_url, "--dev-account", "0", "--out", str(record),
        "--unbonding-blocks", "5",
    )  # fmt: skip
    deployment = json.loads(record.read_text())
    assert deployment["address"] == address
    assert deployment["chain_id"] == anvil.chain_id
    assert deployment["deployer"] == owner.address
    assert deployment["slash_bps"] == 1000
    assert (
        deployment["unbonding_blocks"]
        == 5
        == LedgerClient.from_deployment(record).unbonding_blocks()
    )

    # The owner's key through the environment, as an operator would pass it.
    monkeypatch.setenv("PRIME_CHAIN_PRIVATE_KEY", owner.key.to_0x_hex())
    common = ("--deployment", str(record))
    pool = ok(
        capsys, "create-pool", *common, "--orchestrator-url", "http://orch.test:8000",
        "--min-stake", "0.5ether", "--reward-per-unit", "2gwei", "--trainer", TRAINER,
    )  # fmt: skip
    assert pool == "1"
    assert (
        ok(capsys, "add-validator", *common, "--pool", pool, "--validator", validator.address)
        == f"pool 1: validator {validator.address} registered"
    )
    assert (
        ok(
            capsys,
            "set-orchestrator-url",
            *common,
            "--pool",
            pool,
            "--orchestrator-url",
            "http://o2",
        )
        == "pool 1: orchestrator http://o2"
    )
    assert (
        ok(capsys, "set-trainer", *common, "--pool", pool, "--trainer", trainer.address.lower())
        == f"pool 1: trainer {trainer.address}"
    )
    assert ok(capsys, "fund-pool", *common, "--pool", pool, "--amount", "3ether") == str(3 * 10**18)

    assert json.loads(ok(capsys, "pool-info", *common, "--pool", pool)) == {
        "pool_id": 1,
        "owner": owner.address,
        "orchestrator_url": "http://o2",
        "trainer": trainer.address,
        "min_stake": 5 * 10**17,
        "reward_per_unit": 2 * 10**9,
        "funds": 3 * 10**18,
        "total_attested_units": 0,
        "status": "active",
        "reporter_bps": 1000,
        "burn_slashed": False,
        "batches": 0,
        "burnt": 0,
        "challenge_blocks": 5,
        "unbonding_blocks": 5,
    }
    status = ok(capsys, "pool-status", *common, "--pool", pool)
    assert "status            active" in status and "funds             3 ETH" in status
    assert "min stake         0.5 ETH" in status

    worker_client = LedgerClient.from_deployment(record, worker)
    worker_client.join(1, 10**18)
    balances = json.loads(
        ok(capsys, "balances", *common, "--pool", pool, "--worker", worker.address.lower())
    )
    assert balances["worker"] == worker.address
    assert (balances["is_member"], balances["stake"], balances["reward_balance"]) == (
        True, 10**18, 0,
    )  # fmt: skip
    assert balances["unbonding_until"] == 0
    status = ok(capsys, "worker-status", *common, "--pool", pool, "--worker", worker.address)
    assert "membership    member" in status and "stake         1 ETH" in status
    assert "rewards       0 ETH claimable, 0 ETH in the window" in status
    left = worker_client.leave(1)
    balances = json.loads(
        ok(capsys, "balances", *common, "--pool", pool, "--worker", worker.address)
    )
    assert (balances["is_member"], balances["stake"], balances["unbonding_until"]) == (
        False, 10**18, left.tx.block_number + 5,
    )  # fmt: skip
    assert LedgerClient.from_deployment(record).is_validator(1, validator.address)
    ok(capsys, "remove-validator", *common, "--pool", pool, "--validator", validator.address)
    assert not LedgerClient.from_deployment(record).is_validator(1, validator.address)

    # A pool opened pending: its slash policy set before anyone can join, then opened, ended.
    second = ok(
        capsys, "create-pool", *common, "--orchestrator-url", "http://orch.test:8001",
        "--min-stake", "1ether", "--reward-per-unit", "1gwei", "--trainer", TRAINER, "--pending",
    )  # fmt: skip
    assert "status            pending" in ok(capsys, "pool-status", *common, "--pool", second)
    ok(capsys, "set-slash-policy", *common, "--pool", second, "--reporter-bps", "2500", "--burn")
    ok(capsys, "activate-pool", *common, "--pool", second)
    status = ok(capsys, "pool-status", *common, "--pool", second)
    assert "status            active" in status
    assert "slashes           25 % to the reporter, the rest burnt" in status
    code, _, err = run_cli(capsys, "set-slash-policy", *common, "--pool", second,
                           "--reporter-bps", "0")  # fmt: skip
    assert (code, err.strip()) == (
        1, "prime-chain set-slash-policy: error: set_slash_policy reverted: pool not pending",
    )  # fmt: skip
    ok(capsys, "end-pool", *common, "--pool", second)
    assert json.loads(ok(capsys, "pool-info", *common, "--pool", second))["status"] == "ended"


def test_key_file_is_created_and_reused(
    anvil: Anvil, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key_file = tmp_path / "keys" / "operator.json"
    out = tmp_path / "d.json"
    deploy = ("deploy", "--rpc-url", anvil.rpc_url, "--key-file", str(key_file), "--out", str(out))

    # A fresh key has no ether: the deploy fails, clearly, and the key file stays for reuse.
    code, _, err = run_cli(capsys, *deploy)
    assert code == 1
    assert "insufficient funds" in err.lower()
    assert key_file.stat().st_mode & 0o777 == 0o600
    created = json.loads(key_file.read_text())["address"]
    assert not out.exists()

    funder = anvil.dev_accounts(1)[0]
    w3 = make_web3(anvil.rpc_url)
    tx = {
        "to": created, "value": 10**18, "gas": 21_000, "gasPrice": 2 * w3.eth.gas_price,
        "nonce": w3.eth.get_transaction_count(funder.address, "pending"),
        "chainId": anvil.chain_id,
    }  # fmt: skip
    signed = funder.sign_transaction(tx)
    w3.eth.wait_for_transaction_receipt(w3.eth.send_raw_transaction(signed.raw_transaction))

    ok(capsys, *deploy)
    assert json.loads(out.read_text())["deployer"] == created
    # `address` prints it (what an operator hands the pool owner), creating nothing new.
    assert ok(capsys, "address", "--key-file", str(key_file)).strip() == created
    fresh = tmp_path / "keys" / "validator.json"
    shown = ok(capsys, "address", "--key-file", str(fresh)).strip()
    assert shown == json.loads(fresh.read_text())["address"] != created


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["create-pool", "--deployment", "d.json", "--orchestrator-url", "u", "--min-stake",
          "lots", "--reward-per-unit", "1", "--trainer", TRAINER], 2, "invalid amount 'lots'"),
        (["create-pool", "--deployment", "d.json", "--orchestrator-url", "u", "--min-stake",
          "1", "--reward-per-unit", "1"], 2, "the following arguments are required: --trainer"),
        (["set-trainer", "--deployment", "d.json", "--pool", "1", "--trainer", "0xnope"], 2,
         "invalid address '0xnope'"),
        (["deploy", "--rpc-url", "RPC", "--unbonding-blocks", "-1"], 2,
         "invalid block count '-1'"),
        (["fund-pool", "--deployment", "d.json", "--pool", "1", "--amount", "1.5wei"], 2,
         "not a whole number of wei"),
        (["balances", "--deployment", "d.json", "--pool", "1", "--worker", "0xnope"], 2,
         "invalid address '0xnope'"),
        (["pool-info", "--deployment", "d.json", "--pool", "0"], 2, "invalid pool id '0'"),
        (["deploy", "--rpc-url", "RPC", "--slash-bps", "20000"], 2, "invalid basis points"),
        (["pool-info", "--deployment", "missing.json", "--pool", "1"], 1,
         "deployment file missing.json does not exist"),
        (["pool-info", "--deployment", "BROKEN", "--pool", "1"], 1, "is not valid JSON"),
        (["deploy", "--rpc-url", "RPC", "--out", "d.json"], 1, "give exactly one of --key-file"),
        (["deploy", "--rpc-url", "RPC", "--private-key", "0x12", "--out", "d.json"], 1,
         "not a valid 32-byte hex key"),
        (["deploy", "--rpc-url", "DOWN", "--dev-account", "0"], 1, "cannot reach the node"),
        (["deploy", "--rpc-url", "RPC", "--key-file", "BROKEN"], 1, "is not valid JSON"),
    ],
)  # fmt: skip
def test_bad_input_is_a_clear_error(
    args: list[str],
    code: int,
    message: str,
    anvil: Anvil,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PRIME_CHAIN_PRIVATE_KEY", raising=False)
    (tmp_path / "broken.json").write_text("{not json")
    subst = {
        "RPC": anvil.rpc_url,
        "DOWN": f"http://127.0.0.1:{free_port()}",
        "BROKEN": str(tmp_path / "broken.json"),
    }
    got, _, err = run_cli(capsys, *[subst.get(a, a) for a in args])
    assert got == code
    assert message in err


def test_chain_refusals_name_the_problem(
    anvil: Anvil, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "deployment.json"
    ok(capsys, "deploy", "--rpc-url", anvil.rpc_url, "--dev-account", "0", "--out", str(record))
    common = ("--deployment", str(record))

    code, _, err = run_cli(capsys, "pool-info", *common, "--pool", "7")
    assert (code, err.strip()) == (1, "prime-chain pool-info: error: pool reverted: unknown pool")

    ok(
        capsys, "create-pool", *common, "--orchestrator-url", "http://o.test",
        "--min-stake", "1", "--reward-per-unit", "1", "--trainer", TRAINER, "--dev-account", "0",
    )  # fmt: skip
    code, _, err = run_cli(
        capsys, "register-validator", *common, "--pool", "1",
        "--validator", anvil.dev_accounts(2)[1].address, "--dev-account", "1",
    )  # fmt: skip
    assert code == 1
    assert "register_validator reverted: not the pool owner" in err
    code, _, err = run_cli(
        capsys, "set-trainer", *common, "--pool", "1", "--trainer", TRAINER, "--dev-account", "1",
    )  # fmt: skip
    assert (code, err.strip()) == (
        1, "prime-chain set-trainer: error: set_trainer reverted: not the pool owner",
    )  # fmt: skip

    down = f"http://127.0.0.1:{free_port()}"
    code, _, err = run_cli(capsys, "pool-info", *common, "--rpc-url", down, "--pool", "1")
    assert code == 1
    assert "cannot reach the node" in err
