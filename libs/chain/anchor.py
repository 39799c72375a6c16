"""Trust anchors read from the pool record, never from an off-chain service."""

from __future__ import annotations

from prime_swarm.protocol.messages import normal_address

from .errors import ChainError
from .models import Pool


def trusted_trainer(pool: Pool, pinned: str | None) -> str:
    """The key whose signature makes a policy version trustworthy: the one the pool names on
    chain, or a pinned one that must agree with it. A mismatch means a rotated trainer or a
    lying RPC endpoint; either way the operator decides, so it is an error, not a warning."""
    if pinned is not None and normal_address(pinned) != normal_address(pool.trainer):
        raise ChainError(
            f"the pinned trainer {pinned} differs from the trainer {pool.trainer} that pool "
            f"{pool.pool_id} names on chain; check the pool, then pin the right one"
        )
    return pool.trainer
