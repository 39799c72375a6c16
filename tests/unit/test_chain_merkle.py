"""The off-chain batch commitment (libs/chain/merkle.py) and the client's reading of a batch's
skips: the pure logic the ledger's on-chain tree must agree with (checked on anvil in
tests/integration/test_chain_ledger.py)."""

from __future__ import annotations

import pytest
from eth_abi import encode
from eth_utils import keccak

from prime_swarm.libs.chain import merkle
from prime_swarm.libs.chain.client import _without
from prime_swarm.libs.chain.models import SkippedWork, SkipReason, Work

A = "0x" + "aa" * 20
B = "0x" + "bb" * 20


def items(n: int) -> list[Work]:
    return [Work(A, i, i + 1) for i in range(n)]


def test_leaf_is_the_abi_encoding_hashed() -> None:
    w = Work(A, 7, 3)
    assert merkle.leaf(1, w) == keccak(
        encode(["uint256", "address", "uint256", "uint256"], [1, A, 7, 3])
    )
    # The pool is part of the leaf: a proof from one pool is worthless in another.
    assert merkle.leaf(1, w) != merkle.leaf(2, w)


def test_small_trees_by_hand() -> None:
    one = items(1)
    assert merkle.root(1, one) == merkle.leaf(1, one[0])
    assert merkle.proof(1, one, 0) == []

    three = items(3)
    l0, l1, l2 = (merkle.leaf(1, w) for w in three)
    pair = keccak(min(l0, l1) + max(l0, l1))
    # The odd leaf is carried up unchanged, then paired with the first pair.
    assert merkle.root(1, three) == keccak(min(pair, l2) + max(pair, l2))
    assert merkle.proof(1, three, 2) == [pair]
    assert merkle.proof(1, three, 0) == [l1, l2]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 64, 256])
def test_every_item_proves_and_nothing_else_does(n: int) -> None:
    batch = items(n)
    root = merkle.root(9, batch)
    for i, w in enumerate(batch):
        proof = merkle.proof(9, batch, i)
        assert len(proof) <= 8  # the contract's MAX_PROOF
        assert merkle.verify(9, w, proof, root)
        assert not merkle.verify(9, Work(w.worker, w.work_id, w.units + 1), proof, root)
        assert not merkle.verify(9, Work(B, w.work_id, w.units), proof, root)
    if n > 1:
        assert not merkle.verify(9, batch[0], merkle.proof(9, batch, 1), root)


def test_an_empty_tree_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one leaf"):
        merkle.root(1, [])


def test_credited_items_follow_the_contracts_skips() -> None:
    sent = [Work(A, 0, 1), Work(A, 1, 1), Work(A, 1, 1), Work(B, 0, 2), Work(B, 1, 2)]
    skipped = [
        SkippedWork(A, 0, SkipReason.SETTLED),  # settled before this batch
        SkippedWork(A.upper().replace("0X", "0x"), 1, SkipReason.SETTLED),  # the repeat
        SkippedWork(B, 1, SkipReason.NOT_MEMBER),
    ]
    assert _without(sent, skipped) == [Work(A, 1, 1), Work(B, 0, 2)]
    assert _without(sent, []) == [sent[0], sent[1], sent[3], sent[4]]
