"""Streaming verification of one shard: every path that accepts shard bytes goes through here."""

from __future__ import annotations

import hashlib

from prime_swarm.protocol.messages import ShardInfo

from .errors import ShardHashError, ShardTooLargeError


class ShardVerifier:
    """Hashes bytes as they arrive and refuses them as soon as they overrun the shard.

    Refusing before the write (not after) matters: a sink writing at file offsets must never
    spill into the neighbouring shard.
    """

    def __init__(self, shard: ShardInfo) -> None:
        self.shard = shard
        self.received = 0
        self._hash = hashlib.sha256()

    def update(self, chunk: bytes) -> None:
        if self.received + len(chunk) > self.shard.size:
            raise ShardTooLargeError(
                f"shard {self.shard.index}: more than the expected {self.shard.size} bytes"
            )
        self._hash.update(chunk)
        self.received += len(chunk)

    def finish(self) -> None:
        if self.received != self.shard.size:
            raise ShardHashError(
                f"shard {self.shard.index}: got {self.received} bytes, expected {self.shard.size}"
            )
        digest = self._hash.hexdigest()
        if digest != self.shard.sha256:
            raise ShardHashError(f"shard {self.shard.index}: sha256 {digest} is not the signed one")
