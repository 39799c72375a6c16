"""The ledger's batch commitment, computed off chain: the same tree SwarmLedger.vy builds.

Leaf: keccak256(abi_encode(pool_id, worker, work_id, units)); a pair is hashed in sorted order
(so a proof is just the siblings, bottom up); an odd node is carried up unchanged. A leaf hashes
128 bytes and an inner node 64, so no inner node can be passed off as a leaf.
"""

from __future__ import annotations

from collections.abc import Sequence

from eth_abi import encode
from eth_utils import keccak

from .models import Work


def leaf(pool_id: int, work: Work) -> bytes:
    return keccak(
        encode(
            ["uint256", "address", "uint256", "uint256"],
            [pool_id, work.worker, work.work_id, work.units],
        )
    )


def hash_pair(a: bytes, b: bytes) -> bytes:
    return keccak(a + b) if a < b else keccak(b + a)


def _levels(leaves: Sequence[bytes]) -> list[list[bytes]]:
    if not leaves:
        raise ValueError("a Merkle tree needs at least one leaf")
    levels = [list(leaves)]
    while len(levels[-1]) > 1:
        below = levels[-1]
        up = [
            hash_pair(below[i], below[i + 1]) if i + 1 < len(below) else below[i]
            for i in range(0, len(below), 2)
        ]
        levels.append(up)
    return levels


def root(pool_id: int, items: Sequence[Work]) -> bytes:
    return _levels([leaf(pool_id, w) for w in items])[-1][0]


def proof(pool_id: int, items: Sequence[Work], index: int) -> list[bytes]:
    """Siblings of item `index` from the leaf up, in the order `dispute`/`verify_item` take."""
    levels = _levels([leaf(pool_id, w) for w in items])
    out: list[bytes] = []
    for level in levels[:-1]:
        sibling = index ^ 1
        if sibling < len(level):  # the odd node out has no sibling at this level
            out.append(level[sibling])
        index //= 2
    return out


def verify(pool_id: int, item: Work, siblings: Sequence[bytes], expected_root: bytes) -> bool:
    node = leaf(pool_id, item)
    for s in siblings:
        node = hash_pair(node, s)
    return node == expected_root
