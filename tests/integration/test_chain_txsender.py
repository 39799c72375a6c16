"""The transaction sender never wedges, on a real anvil: a transaction stuck behind a fee spike
is replaced with higher fees until it lands and the next send goes through; a chain that mines
nothing fails a send within its timeout without poisoning the nonce; two senders of one key
(two processes, several threads each) share nonces without losing a transaction."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.types import TxParams

from prime_swarm.libs.chain.anvil import Anvil
from prime_swarm.libs.chain.errors import ChainError
from prime_swarm.libs.chain.transactions import TxSender, make_web3


class Transfer:
    """A plain value transfer as a `Buildable`: what `TxSender.send` takes."""

    def __init__(self, w3: Web3, to: str) -> None:
        self.w3, self.to = w3, to

    def build_transaction(self, transaction: TxParams | None = None) -> TxParams:
        tx: dict[str, Any] = {**(transaction or {}), "to": self.to, "chainId": self.w3.eth.chain_id}
        tx["gas"] = self.w3.eth.estimate_gas(tx)  # type: ignore[arg-type]
        return tx  # type: ignore[return-value]


@pytest.fixture
def node() -> Iterator[Anvil]:
    # Its own chain: these tests stop mining and spike fees, which would stall anyone else.
    with Anvil(accounts=4) as anvil:
        yield anvil


def rpc(w3: Web3, method: str, *params: object) -> None:
    reply = w3.provider.make_request(method, list(params))  # type: ignore[arg-type]
    assert "error" not in reply, reply


def test_a_stuck_transaction_is_bumped_until_it_lands(
    node: Anvil, caplog: pytest.LogCaptureFixture
) -> None:
    sender_acct, to = node.dev_accounts()[0], node.dev_accounts()[1].address
    w3 = make_web3(node.rpc_url)
    sender = TxSender(w3, sender_acct, timeout=60, stuck_after_s=0.3, poll_interval=0.05)
    first_fee = sender._fees()[0]
    # Nothing is mined: the transaction waits in the pool, as behind blocks full of others.
    rpc(w3, "evm_setAutomine", False)

    def unstick() -> None:
        # The chain moves again once the sender has replaced its transaction twice.
        while sender.bumps < 2:
            threading.Event().wait(0.05)
        rpc(make_web3(node.rpc_url), "evm_setAutomine", True)
        rpc(make_web3(node.rpc_url), "evm_mine")

    threading.Thread(target=unstick, daemon=True).start()
    caplog.set_level(logging.INFO, logger="chain.tx")
    receipt = sender.send(Transfer(w3, to), "transfer", value=1)
    assert receipt["status"] == 1
    mined = w3.eth.get_transaction(receipt["transactionHash"])
    # A replacement landed, not the first version: its fee is at least two bumps up.
    assert mined["maxFeePerGas"] >= int(first_fee * 1.125 * 1.125)
    assert mined["nonce"] == 0
    assert sum("fees raised" in r.getMessage() for r in caplog.records) >= 2

    # The queue behind it moves: the next send takes the next nonce and lands at once.
    before = sender.bumps
    nxt = sender.send(Transfer(w3, to), "transfer", value=1)
    assert w3.eth.get_transaction(nxt["transactionHash"])["nonce"] == 1
    assert sender.bumps == before


def test_no_mining_fails_within_the_timeout_and_the_next_send_recovers(node: Anvil) -> None:
    sender_acct, to = node.dev_accounts()[0], node.dev_accounts()[1].address
    w3 = make_web3(node.rpc_url)
    sender = TxSender(w3, sender_acct, timeout=2, stuck_after_s=0.5, poll_interval=0.05)
    rpc(w3, "evm_setAutomine", False)
    try:
        with pytest.raises(ChainError, match="no receipt") as err:
            sender.send(Transfer(w3, to), "transfer", value=1)
        assert err.value.tx_hash
    finally:
        rpc(w3, "evm_setAutomine", True)
    # The stuck transaction (some version of it) is still in the pool; the next send takes the
    # nonce after it and both land with the next blocks.
    receipt = sender.send(Transfer(w3, to), "transfer", value=2)
    assert receipt["status"] == 1
    assert w3.eth.get_transaction_count(sender_acct.address) == 2


def test_two_senders_of_one_key_share_nonces(node: Anvil) -> None:
    acct: LocalAccount = node.dev_accounts()[2]
    to = node.dev_accounts()[3].address
    w3a, w3b = make_web3(node.rpc_url), make_web3(node.rpc_url)
    senders = [TxSender(w3a, acct, timeout=30), TxSender(w3b, acct, timeout=30)]
    errors: list[BaseException] = []
    hashes: list[Any] = []
    lock = threading.Lock()

    def send(sender: TxSender, amount: int) -> None:
        try:
            r = sender.send(Transfer(sender.w3, to), "transfer", value=amount)
            with lock:
                hashes.append(r["transactionHash"])
        except BaseException as exc:  # reported on the main thread
            errors.append(exc)

    # Ten different transfers (amounts 1..10), as two processes would send different calls.
    threads = [threading.Thread(target=send, args=(senders[i % 2], i + 1)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    nonces = sorted(w3a.eth.get_transaction(h)["nonce"] for h in hashes)
    assert nonces == list(range(10))
    assert w3a.eth.get_transaction_count(acct.address) == 10
    assert sorted(w3a.eth.get_transaction(h)["value"] for h in hashes) == list(range(1, 11))
