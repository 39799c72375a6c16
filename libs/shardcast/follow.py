"""Byte-level cut-through: stream a shard while this node is still receiving it.

Shard-level cut-through alone serves a shard only once it is whole. A relay pulls a version's
shards in parallel, so they all complete near the end, and on a shaped tree the relays' uplinks
sat idle while the origin's bytes came in (128 MiB, 200 Mbit links: 35 s against a 21.5 s bound).
Following the writer instead forwards each byte as soon as it is on disk here.

The bytes are not verified yet: the writer hashes the shard only when it is complete. That is
safe because every downstream reader hashes every shard against the signed manifest itself, and
the last byte is held back until the writer has verified the shard: a reader following a writer
that fails (bad hash, upstream cut off) is cut off too, so it sees a short body and resumes or
retries elsewhere, never a complete wrong shard.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from .errors import ShardcastError
from .store import ShardWriter

CHUNK = 1024 * 1024
POLL_FIRST_S = 0.002
POLL_MAX_S = 0.02


class FollowBroken(ShardcastError):
    """The writer being followed failed or started over: the response must be cut short."""


class ShardFollower:
    """Streams one shard from `start` as its writer receives it, to the end of the shard.

    Construction opens the writer's temporary file and raises FileNotFoundError if the writer
    is already done with it (the caller then serves the committed file, or a 404). Once open, the
    file stays readable through the commit's rename.
    """

    def __init__(
        self, writer: ShardWriter, start: int = 0, *, idle_timeout_s: float = 30.0
    ) -> None:
        self.writer = writer
        self.start = start
        self.idle_timeout_s = idle_timeout_s
        self._generation = writer.generation
        self._fd: int | None = os.open(writer.tmp_path, os.O_RDONLY)

    @property
    def length(self) -> int:
        return self.writer.shard.size - self.start

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _check(self) -> None:
        if self.writer.generation != self._generation or self.writer.state == "failed":
            raise FollowBroken(f"shard {self.writer.shard.index}: upstream transfer failed")

    async def chunks(self) -> AsyncIterator[bytes]:
        """The bytes, as they arrive; FollowBroken if the writer fails, restarts or stalls."""
        assert self._fd is not None, "follower already closed"
        writer, size, pos = self.writer, self.writer.shard.size, self.start
        loop = asyncio.get_running_loop()
        pause = POLL_FIRST_S
        idle_since = loop.time()
        try:
            while pos < size:
                self._check()
                # The last byte waits for the commit, so a shard that fails its hash here is
                # always cut short downstream. "committed" means the file is whole.
                end = size if writer.state == "committed" else min(writer.readable, size - 1)
                if end <= pos:
                    if loop.time() - idle_since > self.idle_timeout_s:
                        raise FollowBroken(
                            f"shard {writer.shard.index}: no bytes for {self.idle_timeout_s:g}s"
                        )
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, POLL_MAX_S)
                    continue
                # Just written, so in the page cache: a direct read costs microseconds, less
                # than a hop to a thread.
                data = os.pread(self._fd, min(CHUNK, end - pos), pos)
                self._check()  # a reset between the two checks truncated what was just read
                if not data:
                    raise FollowBroken(f"shard {writer.shard.index}: file shorter than announced")
                pos += len(data)
                pause = POLL_FIRST_S
                idle_since = loop.time()
                yield data
        finally:
            self.close()
