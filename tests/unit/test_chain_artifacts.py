"""The committed ledger artifacts are what the sources compile to, and expose the agreed API."""

from __future__ import annotations

import json

from prime_swarm.libs.chain.artifacts import BUILD_DIR, LEDGER_CONTRACT, load_artifact
from prime_swarm.libs.chain.client import MAX_BATCH
from prime_swarm.libs.chain.compile import compile_all, source_paths


def test_committed_artifacts_match_a_fresh_compile() -> None:
    fresh = compile_all()
    assert set(fresh) == {p.stem for p in source_paths()}
    for name, text in fresh.items():
        committed = (BUILD_DIR / f"{name}.json").read_text()
        assert committed == text, f"{name}.json is stale: run `prime-chain compile`"


def test_ledger_abi_surface() -> None:
    abi = load_artifact(LEDGER_CONTRACT).abi
    functions = {e["name"]: e for e in abi if e["type"] == "function"}
    events = {e["name"] for e in abi if e["type"] == "event"}
    assert {
        "create_pool", "set_orchestrator_url", "set_trainer", "pool", "pool_funds", "pool_count",
        "fund_pool", "join", "leave", "withdraw", "is_member", "stake_of", "unbonding_until",
        "register_validator", "remove_validator", "is_validator", "attest_work", "is_settled",
        "work_units", "work_id_floor", "total_attested_units", "batch_count", "batch",
        "verify_item", "slash", "dispute", "rewards_of", "claim_rewards", "burnt",
        "activate_pool", "end_pool", "set_slash_policy", "pool_state",
        "SLASH_BPS", "UNBONDING_BLOCKS", "CHALLENGE_BLOCKS", "MAX_BATCH",
    } <= set(functions)  # fmt: skip
    assert {
        "PoolCreated", "PoolFunded", "WorkerJoined", "StakeAdded", "WorkerLeft", "StakeWithdrawn",
        "ValidatorRegistered", "ValidatorRemoved", "BatchAttested", "WorkCredited",
        "WorkSkipped", "WorkerSlashed", "WorkDisputed", "RewardsClaimed",
        "OrchestratorUrlChanged", "TrainerChanged", "PoolStatusChanged", "SlashPolicySet",
    } <= events  # fmt: skip
    for payable in ("join", "fund_pool"):
        assert functions[payable]["stateMutability"] == "payable"
    attest_inputs = [i["type"] for i in functions["attest_work"]["inputs"]]
    assert attest_inputs == ["uint256", "address[]", "uint256[]", "uint256[]"]

    def types(entries: list[dict]) -> list[str]:
        return [e["type"] for e in entries]

    (constructor,) = (e for e in abi if e["type"] == "constructor")
    assert [i["name"] for i in constructor["inputs"]] == [
        "slash_bps", "unbonding_blocks", "challenge_blocks",
    ]  # fmt: skip
    assert types(functions["create_pool"]["inputs"]) == ["string", "uint256", "uint256", "address"]
    assert types(functions["pool"]["outputs"]) == [
        "address", "string", "uint256", "uint256", "address",
    ]  # fmt: skip


def test_client_batch_size_matches_the_contract() -> None:
    source = (BUILD_DIR.parent / f"{LEDGER_CONTRACT}.vy").read_text()
    assert f"MAX_BATCH: public(constant(uint256)) = {MAX_BATCH}" in source


def test_artifact_is_plain_json_with_bytecode() -> None:
    data = json.loads((BUILD_DIR / f"{LEDGER_CONTRACT}.json").read_text())
    assert data["compiler"].startswith("vyper 0.4.")
    assert data["bytecode"].startswith("0x") and len(data["bytecode"]) > 1000
