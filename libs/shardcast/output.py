"""A downloaded file being written, shard by shard, at the shards' offsets.

Where the file system allows it, block-aligned runs are written with `O_DIRECT`: from the
receive buffer straight to the disk, never through the page cache. A client writes each version
once and reads it back at most once (to load it), so caching it buys little, and the buffered
write costs: the copy into freshly allocated page-cache pages was 36 % of all CPU of the loopback
broadcast (`perf`, 8 clients on 2 cores), and on VMs that hand freed memory back to the host
(free-page reporting) a fresh page costs up to ten times a recycled one. Dirty pages also stop
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
    def __init__(self, fd: int, direct_fd: int | None) -> None:
        self.fd, self.direct_fd = fd, direct_fd

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
        if self.direct_fd is not None and pos % BLOCK == 0:
            aligned = len(data) - len(data) % BLOCK
            if aligned:
                try:
                    pos = _pwrite_all(self.direct_fd, data[:aligned], pos)
                    data = data[aligned:]
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    # An unaligned buffer (or a file system that takes O_DIRECT at open and not
                    # at write): nothing was written, the buffered path takes it, and the rest.
                    os.close(self.direct_fd)
                    self.direct_fd = None
        return _pwrite_all(self.fd, data, pos)

    def close(self) -> None:
        for fd in (self.direct_fd, self.fd):
            if fd is not None:
                os.close(fd)
        self.direct_fd = None


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
