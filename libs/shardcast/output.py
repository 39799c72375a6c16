"""A downloaded file being written, shard by shard, at the shards' offsets.

Where the file system allows it, block-aligned runs are written with `O_DIRECT`: from the
receive buffer straight to the disk, never through the page cache. A client writes each version
once and reads it back at most once (to load it), so caching it buys little, and the buffered
write costs: the copy into freshly allocated page-cache pages was 36 % of all CPU of the loopback
broadcast (`perf`, 8 clients on 2 cores), and on VMs that hand freed memory back to the host
(free-page reporting) a fresh page costs up to ten times a recycled one. Dirty pages also throttle
the download once they pass the kernel's dirty limit (a few GB: one large checkpoint).

What is not aligned (the tail of a file, a transfer resumed mid-block, a buffer the caller did
not align) goes through the page cache as before; the kernel keeps the two coherent. A file
system without `O_DIRECT` (or a platform) simply gets buffered writes.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

BLOCK = 4096
"""Alignment of direct writes: offset, length and buffer address (covers 512 B and 4 KiB disks)."""


class OutputFile:
    """Shared by the threads fetching the file's shards: each writes its own region."""

    def __init__(self, fd: int, direct_fd: int | None) -> None:
        self.fd, self._direct_fd = fd, direct_fd
        # Whether aligned runs still go direct: off for good once the kernel refuses one.
        self.direct = direct_fd is not None

    @classmethod
    def create(cls, path: Path, size: int, direct: bool = True) -> OutputFile:
        """A new file of `size` bytes (sparse until written); fails if `path` exists."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(fd, size)
            return cls(fd, _open_direct(path) if direct else None)
        except BaseException:
            os.close(fd)
            raise

    def write_at(self, data: memoryview, pos: int) -> int:
        """Write all of `data` at `pos`; the position after it."""
        if self.direct and self._direct_fd is not None and pos % BLOCK == 0:
            aligned = len(data) - len(data) % BLOCK
            if aligned:
                try:
                    pos = _pwrite_all(self._direct_fd, data[:aligned], pos)
                    data = data[aligned:]
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    # An unaligned buffer (or a file system that takes O_DIRECT at open and not
                    # at write): the buffered path writes it all again from `pos`. The
                    # descriptor stays open until `close`: another thread may be using it.
                    self.direct = False
        return _pwrite_all(self.fd, data, pos)

    def close(self) -> None:
        """Once, after every writer is done (closing twice could close a reused number)."""
        if self._direct_fd is not None:
            os.close(self._direct_fd)
            self._direct_fd = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _open_direct(path: Path) -> int | None:
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_WRONLY | flag)
    except OSError:  # EINVAL: this file system has no direct I/O
        return None


def _pwrite_all(fd: int, data: memoryview, pos: int) -> int:
    while data:
        n = os.pwrite(fd, data, pos)
        pos += n
        data = data[n:]
    return pos
