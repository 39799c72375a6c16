"""Deploy the ledger from the committed artifact and describe where it landed."""

from __future__ import annotations

from eth_account.signers.local import LocalAccount

from .artifacts import LEDGER_CONTRACT, load_artifact
from .deployment import (
    DEFAULT_CHALLENGE_BLOCKS,
    DEFAULT_SLASH_BPS,
    DEFAULT_UNBONDING_BLOCKS,
    Deployment,
)
from .errors import ChainError
from .transactions import TxSender, chain_errors, make_web3


def deploy_ledger(
    rpc_url: str,
    account: LocalAccount,
    *,
    slash_bps: int = DEFAULT_SLASH_BPS,
    unbonding_blocks: int = DEFAULT_UNBONDING_BLOCKS,
    challenge_blocks: int | None = None,
    timeout: float = 120.0,
) -> Deployment:
    """Deploy SwarmLedger with `account`; returns the record to write with `write_deployment`.
    `challenge_blocks` defaults to DEFAULT_CHALLENGE_BLOCKS, or the unbonding period if that is
    shorter (the contract refuses a window longer than it)."""
    if not 0 <= slash_bps <= 10_000:
        raise ChainError(f"slash_bps must be within 0..10000, got {slash_bps}")
    if unbonding_blocks < 0:
        raise ChainError(f"unbonding_blocks must be >= 0, got {unbonding_blocks}")
    if challenge_blocks is None:
        challenge_blocks = min(DEFAULT_CHALLENGE_BLOCKS, unbonding_blocks)
    if not 0 <= challenge_blocks <= unbonding_blocks:
        raise ChainError(
            f"challenge_blocks must be within 0..unbonding_blocks ({unbonding_blocks}), "
            f"got {challenge_blocks}"
        )
    artifact = load_artifact(LEDGER_CONTRACT)
    w3 = make_web3(rpc_url)
    with chain_errors("deploy", rpc_url):
        chain_id = w3.eth.chain_id
    factory = w3.eth.contract(abi=artifact.abi, bytecode=artifact.bytecode)
    sender = TxSender(w3, account, timeout=timeout)
    receipt = sender.send(
        factory.constructor(slash_bps, unbonding_blocks, challenge_blocks),
        f"deploy {artifact.name}",
    )
    return Deployment(
        rpc_url=rpc_url,
        chain_id=chain_id,
        address=receipt["contractAddress"],
        deployer=account.address,
        block=receipt["blockNumber"],
        tx_hash=receipt["transactionHash"].to_0x_hex(),
        contract=artifact.name,
        slash_bps=slash_bps,
        unbonding_blocks=unbonding_blocks,
        challenge_blocks=challenge_blocks,
    )
