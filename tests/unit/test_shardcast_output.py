"""`OutputFile`: shards written at their offsets, block-aligned runs with O_DIRECT where the
file system has it, everything else (tails, odd offsets, unaligned buffers) through the page
cache, and the file's bytes exactly what was written either way."""

from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path

import numpy as np
import pytest

from prime_swarm.libs.shardcast import delta
from prime_swarm.libs.shardcast.client import _patch_through
from prime_swarm.libs.shardcast.output import BLOCK, OutputFile


def aligned(data: bytes) -> memoryview:
    """`data` in a page-aligned buffer, as the shard transport receives it."""
    buf = mmap.mmap(-1, max(len(data), 1))
    buf[: len(data)] = data
    return memoryview(buf)[: len(data)]


@pytest.fixture
def payload() -> bytes:
    return os.urandom(5 * BLOCK + 123)


def test_aligned_runs_go_direct_and_the_tail_through_the_cache(
    tmp_path: Path, payload: bytes
) -> None:
    path = tmp_path / "f.bin"
    out = OutputFile.create(path, len(payload))
    direct = out.direct  # False only where the file system lacks O_DIRECT
    assert out.write_at(aligned(payload), 0) == len(payload)
    assert out.direct == direct  # an aligned buffer never turns it off
    out.close()
    assert path.read_bytes() == payload


def test_shards_in_any_order_and_at_odd_offsets(tmp_path: Path, payload: bytes) -> None:
    path = tmp_path / "f.bin"
    out = OutputFile.create(path, len(payload))
    cut = 3 * BLOCK + 7  # a second "shard" that starts off a block boundary
    assert out.write_at(aligned(payload[cut:]), cut) == len(payload)
    assert out.write_at(aligned(payload[:cut]), 0) == cut
    out.close()
    assert path.read_bytes() == payload


def test_an_unaligned_buffer_falls_back_to_buffered_writes(tmp_path: Path, payload: bytes) -> None:
    path = tmp_path / "f.bin"
    out = OutputFile.create(path, len(payload))
    if not out.direct:
        pytest.fail(f"{tmp_path} has no O_DIRECT: this test needs a file system that has it")
    raw = bytearray(len(payload) + 1)
    raw[1:] = payload
    view = memoryview(raw)[1:]  # one byte past an allocation: never 4096-aligned
    assert out.write_at(view, 0) == len(payload)
    assert not out.direct  # refused once, buffered from then on
    out.close()
    assert path.read_bytes() == payload


def test_a_retry_overwrites_the_same_region(tmp_path: Path, payload: bytes) -> None:
    path = tmp_path / "f.bin"
    out = OutputFile.create(path, len(payload))
    out.write_at(aligned(b"\xff" * 2 * BLOCK), 0)  # a failed attempt's bytes
    out.write_at(aligned(payload), 0)
    out.close()
    assert path.read_bytes() == payload


def test_create_refuses_an_existing_file_and_leaves_no_descriptor(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"held")
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(FileExistsError):
        OutputFile.create(path, 10)
    assert len(os.listdir("/proc/self/fd")) == before
    assert path.read_bytes() == b"held"


def test_direct_can_be_turned_off(tmp_path: Path, payload: bytes) -> None:
    out = OutputFile.create(tmp_path / "f.bin", len(payload), direct=False)
    assert not out.direct
    out.write_at(aligned(payload), 0)
    out.close()
    assert (tmp_path / "f.bin").read_bytes() == payload


@pytest.mark.parametrize(
    ("piece", "workers"),
    [(delta.BLOCK_BYTES, 1), (delta.BLOCK_BYTES, 3), (3 * delta.BLOCK_BYTES, 2)],
)
def test_a_rebuild_streams_the_parent_through_small_pieces(
    tmp_path: Path, piece: int, workers: int
) -> None:
    """`client._patch_through`: parent read and patched a piece at a time on `workers` threads,
    hashed and written in order; the file and its hash are the new version's whatever the
    piece size and the threads."""
    rng = np.random.default_rng(3)
    size = 4 * delta.BLOCK_BYTES + 5  # odd, unaligned end
    old = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    new = bytearray(old)
    for at in (0, BLOCK - 1, delta.BLOCK_BYTES, 3 * delta.BLOCK_BYTES + 3, len(new) - 1):
        new[at] ^= 0x5A
    d = delta.encode(old, bytes(new))
    assert d is not None
    (tmp_path / "parent").write_bytes(old)
    out = OutputFile.create(tmp_path / "new", len(old))
    with open(tmp_path / "parent", "rb", buffering=0) as src:
        changes = delta.parse(d, len(old))
        digest = _patch_through(src.fileno(), out, changes, len(old), piece, workers)
    out.close()
    assert (tmp_path / "new").read_bytes() == bytes(new)
    assert digest == hashlib.sha256(new).hexdigest()


def test_a_delta_patches_whole_blocks_only() -> None:
    old = bytes(2 * delta.BLOCK_BYTES)
    changes = delta.parse(delta.encode(old, old) or b"", len(old))
    with pytest.raises(ValueError, match="whole blocks"):
        changes.patch(bytearray(BLOCK), 0)  # a piece that ends mid-block


def test_a_short_parent_is_refused(tmp_path: Path) -> None:
    old = bytes(3 * BLOCK)
    d = delta.encode(old, old)
    assert d is not None
    (tmp_path / "parent").write_bytes(old[:-10])  # shrank after it was checked
    out = OutputFile.create(tmp_path / "new", len(old))
    with open(tmp_path / "parent", "rb", buffering=0) as src, pytest.raises(delta.DeltaError):
        _patch_through(src.fileno(), out, delta.parse(d, len(old)), len(old), delta.BLOCK_BYTES)
    out.close()
