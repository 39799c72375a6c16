#!/usr/bin/env python3
"""One-shot deployer of the compose network (the `deployer` service, chain image).

Against the `anvil` service it:
  1. reads the addresses of the trainer, the validator and each worker (SWARM_ADDRESSES_FILE,
     written by `prime-swarm compose-secrets`: their keys are compose secrets of their own
     services, and this one-shot never holds one),
  2. deploys the ledger   (`prime-chain deploy`),
  3. opens the pool       (`prime-chain create-pool`),
  4. registers the validator (`prime-chain register-validator`),
  5. funds the pool       (`prime-chain fund-pool`),
  6. gives the validator and the workers gas and stake money (anvil_setBalance: dev chain only),
and writes into SWARM_CHAIN_DIR (a volume the services mount read-only):
  deployment.json, network.json and env/<service>.env.

The env files hold the values known only after deployment (ledger address, pool id, trainer
address) under the services' own PRIME_* settings names; the image entrypoint exports them.
Re-running is cheap: when network.json names a pool that still exists on the chain, the deployment
is reused and only the env files are rewritten.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# The deployment values each service reads, by env file and settings variable. Workers and
# validators read the trainer's address from the pool record on chain; relays, which have no
# chain access, are given it.
ENV_FILES: dict[str, dict[str, str]] = {
    "orchestrator.env": {
        "PRIME_ORCH_LEDGER_ADDRESS": "ledger",
        "PRIME_ORCH_POOL_ID": "pool_id",
    },
    "validator.env": {
        "PRIME_VALIDATOR_LEDGER_ADDRESS": "ledger",
        "PRIME_VALIDATOR_POOL_ID": "pool_id",
    },
    "relay.env": {"PRIME_RELAY_TRUSTED_TRAINER": "trainer"},
    "worker.env": {
        "PRIME_WORKER_LEDGER_ADDRESS": "ledger",
        "PRIME_WORKER_POOL_ID": "pool_id",
    },
}


def env(name: str, default: str) -> str:
    return os.environ.get(name, "").strip() or default


def log(msg: str) -> None:
    print(f"deployer: {msg}", file=sys.stderr, flush=True)


def chain(*args: str) -> str:
    """Run `prime-chain ARGS`; its stdout (the machine-readable result), stripped."""
    result = subprocess.run(["prime-chain", *args], stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise SystemExit(f"deployer: prime-chain {args[0]} failed ({result.returncode})")
    return result.stdout.strip()


def wait_rpc(rpc_url: str, timeout_s: float) -> None:
    from prime_swarm.libs.chain.anvil import rpc_ready

    deadline = time.monotonic() + timeout_s
    while not rpc_ready(rpc_url, timeout=1.0):
        if time.monotonic() > deadline:
            raise SystemExit(f"deployer: no JSON-RPC at {rpc_url} within {timeout_s:.0f}s")
        time.sleep(1)


def read_addresses(path: Path) -> tuple[str, str, list[str]]:
    """Trainer, validator and worker addresses from compose-secrets' addresses.json."""
    from eth_utils import to_checksum_address

    try:
        roster = json.loads(path.read_text())
        return (
            to_checksum_address(roster["trainer"]),
            to_checksum_address(roster["validator"]),
            [to_checksum_address(a) for a in roster["workers"]],
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(
            f"deployer: {path}: {exc}; run `prime-swarm compose-secrets` before compose up"
        ) from exc


def set_balance(rpc_url: str, address: str, wei: int) -> None:
    # A dev-chain shortcut, as in deploy/local/network.py; on a real chain fund these yourself.
    from web3 import Web3

    w3 = Web3(Web3.HTTPProvider(rpc_url, request_kwargs={"timeout": 10}))
    reply = w3.provider.make_request("anvil_setBalance", [address, hex(wei)])
    if "error" in reply:
        raise SystemExit(f"deployer: anvil_setBalance failed: {reply['error']}")


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main() -> int:
    from prime_swarm.libs.chain.units import parse_wei

    out = Path(env("SWARM_CHAIN_DIR", "/data/chain"))
    rpc_url = env("SWARM_RPC_URL", "http://anvil:8545")
    orchestrator_url = env("SWARM_ORCHESTRATOR_URL", "http://orchestrator:8000")
    owner = env("SWARM_OWNER_DEV_ACCOUNT", "0")
    addresses = Path(env("SWARM_ADDRESSES_FILE", "/run/secrets/addresses.json"))
    min_stake = env("SWARM_MIN_STAKE", "1ether")
    reward_per_unit = env("SWARM_REWARD_PER_UNIT", "1000000000000")
    pool_funds = env("SWARM_POOL_FUNDS", "10ether")
    worker_balance = parse_wei(env("SWARM_WORKER_BALANCE", "5ether"))
    validator_balance = parse_wei(env("SWARM_VALIDATOR_BALANCE", "100ether"))

    env_dir = out / "env"
    env_dir.mkdir(parents=True, exist_ok=True)
    # Earlier versions kept every key here, where every worker could read the trainer's.
    if (out / "keys").exists():
        shutil.rmtree(out / "keys")
        log(f"removed {out / 'keys'} (keys are compose secrets now)")
    deployment, network_file = out / "deployment.json", out / "network.json"

    wait_rpc(rpc_url, float(env("SWARM_RPC_WAIT_S", "120")))
    trainer, validator, worker_addresses = read_addresses(addresses)

    network: dict[str, object] | None = None
    if network_file.exists() and deployment.exists():
        old = json.loads(network_file.read_text())
        check = subprocess.run(
            ["prime-chain", "pool-info", "--deployment", str(deployment),
             "--rpc-url", rpc_url, "--pool", str(old.get("pool_id", 0))],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        # Keys come from secrets an operator may regenerate: a new key means a new pool.
        same_keys = (old.get("trainer"), old.get("validator")) == (trainer, validator)
        if check.returncode == 0 and same_keys:
            network = old
            log(f"reusing ledger {old['ledger']} pool {old['pool_id']}")
    if network is None:
        for name in ENV_FILES:  # never leave a previous chain's values for the services
            (env_dir / name).unlink(missing_ok=True)
        signer = ["--dev-account", owner]
        ledger = chain("deploy", "--rpc-url", rpc_url, "--out", str(deployment), *signer)
        common = ["--deployment", str(deployment), "--rpc-url", rpc_url]
        pool_id = int(chain(
            "create-pool", *common, "--orchestrator-url", orchestrator_url,
            "--min-stake", min_stake, "--reward-per-unit", reward_per_unit,
            "--trainer", trainer, *signer,
        ))  # fmt: skip
        chain("register-validator", *common, "--pool", str(pool_id),
              "--validator", validator, *signer)  # fmt: skip
        chain("fund-pool", *common, "--pool", str(pool_id), "--amount", pool_funds, *signer)
        network = {
            "rpc_url": rpc_url, "ledger": ledger, "pool_id": pool_id,
            "orchestrator_url": orchestrator_url, "trainer": trainer,
            "validator": validator, "workers": worker_addresses,
        }  # fmt: skip
        log(f"deployed ledger {ledger}, pool {pool_id} -> {orchestrator_url}")

    set_balance(rpc_url, validator, validator_balance)
    for address in worker_addresses:
        set_balance(rpc_url, address, worker_balance)
    write_atomic(network_file, json.dumps(network, indent=2) + "\n")
    for name, variables in ENV_FILES.items():
        lines = [f"{var}={network[field]}" for var, field in variables.items()]
        write_atomic(env_dir / name, "\n".join(lines) + "\n")
    log(f"wrote {network_file} and {len(ENV_FILES)} env files under {env_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
