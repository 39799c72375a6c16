"""Lossless deltas between two versions of one file: the 16-bit words that changed, where, and by
how much.

An RL step at a small learning rate, with fp32 master weights published in bf16, leaves most
bf16 values bit-identical, so a new version differs from its parent in a small fraction of its
16-bit words, and a changed value has mostly moved by one unit in the last place. A delta stores
the gaps between changed word positions and, for each changed word, its difference from the old
word as a 16-bit integer (new - old, wrapping): a bf16 value nudged to its neighbour differs by
+-1 there, whatever its bits (an XOR of the two flips a run of low bits on every carry). Both
arrays are written as LEB128 varints (a gap under 128 and a difference of +-1..63 take one
byte; differences zigzag-mapped) and zlib-compressed. Words, not elements, keep it
dtype-agnostic: the safetensors header and fp32 tensors are handled the same way, at worst a
changed fp32 element costs two words.

Against the previous codec (gaps and XORs split into byte planes, zlib 1), one AdamW-shaped step
of SmolLM2-135M in bf16 went from 8.77 to 6.88 MB (-22 %) for an encode of about 2 s; over 8
real RL steps of the network a delta is 1.04-1.26 % of the file after the first step and 2.6 %
on the first (bench/results/wan.json `deltas`, docs/wide-area.md).

Deltas come from relays; their bytes are checked against the signed manifest before `apply`
runs, and the rebuilt file is checked against the signed hash of the full file after. `apply`
still parses defensively (bounded decompression, every varint and position checked): a trainer
bug must not become a crash or an out-of-bounds write.
"""

from __future__ import annotations

import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

MAGIC = b"PSD3"
# magic, file length in bytes, changed words, packed gap bytes, packed difference bytes
_HEADER = struct.Struct("<4sQQQQ")
WORD = np.dtype("<u2")
# The encode sits on the trainer's path to every version, before the manifest exists.
ZLIB_LEVEL = 6
_VARINT_MAX = 5  # bytes of a varint up to 2**35: gaps are under 2**32, differences 2**16


class DeltaError(ValueError):
    """A delta that does not apply to the given parent."""


def encode(parent: bytes | memoryview, new: bytes | memoryview) -> bytes | None:
    """The delta turning `parent` into `new`, or None when none applies (lengths differ)."""
    if len(parent) != len(new):
        return None
    old_w, new_w = _words(parent), _words(new)
    changed = np.flatnonzero(old_w != new_w)
    gaps = np.diff(changed, prepend=-1)  # >= 1 each; the first from -1
    diffs = (new_w[changed] - old_w[changed]).view(np.int16).astype(np.int64)  # wraps mod 2**16
    streams = [_varints(gaps), _varints((diffs << 1) ^ (diffs >> 63))]  # differences zigzagged
    # zlib releases the GIL: the two streams compress side by side (level 6 on both, one after
    # the other, doubled the encode of a SmolLM2 version to 2.6 s).
    with ThreadPoolExecutor(2) as pool:
        packed, moved = pool.map(lambda raw: zlib.compress(raw, ZLIB_LEVEL), streams)
    header = _HEADER.pack(MAGIC, len(new), len(changed), len(packed), len(moved))
    return header + packed + moved


def changed_share(
    parent: bytes | memoryview, new: bytes | memoryview, samples: int = 4096
) -> float:
    """The share of 16-bit words that differ, estimated from evenly strided samples: whether a
    delta can pay is known for the price of a few thousand comparisons, not a full encode
    (28 ms for a 1.5 MB file whose every word changed)."""
    if len(parent) != len(new):
        return 1.0
    old_w, new_w = _words(parent), _words(new)
    step = max(1, old_w.size // samples)
    return float(np.mean(old_w[::step] != new_w[::step])) if old_w.size else 0.0


BYTES_PER_CHANGED_WORD = 2.0
"""What a changed word costs in a delta at most, a little above the measured 0.9-1.2 (SmolLM2
and a 104M Qwen2 in bf16, lr 5e-6 and 1e-6) and 1.6-2 (random positions and values, tests):
the estimate that decides whether to encode."""


def apply(parent: bytes | memoryview, delta: bytes | memoryview) -> bytes:
    """`parent` with the delta's changes applied: the new file."""
    buf = bytearray(len(parent) + len(parent) % 2)
    buf[: len(parent)] = parent
    parse(delta, len(parent)).patch(buf, 0)
    return bytes(memoryview(buf)[: len(parent)])


@dataclass(frozen=True)
class Changes:
    """A parsed delta: the changed words' positions (ascending) and what to add to each parent
    word (mod 2**16). Applied a piece at a time, a multi-GB file is rebuilt through one small
    buffer."""

    positions: np.ndarray
    diffs: np.ndarray

    def patch(self, piece: bytearray | memoryview, offset: int) -> None:
        """Apply, in place, the changes that fall in `piece`: the file's bytes from `offset`
        (even), of even length (an odd-sized file's last piece padded with a zero byte)."""
        first = offset // WORD.itemsize
        words = np.frombuffer(piece, dtype=WORD)
        lo, hi = np.searchsorted(self.positions, (first, first + words.size))
        words[self.positions[lo:hi] - first] += self.diffs[lo:hi]  # uint16: wraps as encoded


def parse(delta: bytes | memoryview, length: int) -> Changes:
    """The changes of a delta for a parent of `length` bytes, every size and position checked."""
    if len(delta) < _HEADER.size:
        raise DeltaError("delta shorter than its header")
    magic, size, n, gaps_len, moved_len = _HEADER.unpack_from(delta)
    if magic != MAGIC:
        raise DeltaError("not a delta")
    if size != length:
        raise DeltaError(f"delta is for a {size}-byte file, the parent has {length}")
    n_words = (length + 1) // WORD.itemsize
    if n > n_words or _HEADER.size + gaps_len + moved_len != len(delta):
        raise DeltaError("delta sizes do not add up")
    body = memoryview(delta)[_HEADER.size :]
    # A varint is 1-5 bytes: n of them inflate to at most 5n bytes, never more.
    gaps = _from_varints(_inflate(body[:gaps_len], _VARINT_MAX * n, "positions"), n, "positions")
    zigzag = _from_varints(_inflate(body[gaps_len:], _VARINT_MAX * n, "changes"), n, "changes")
    # Gaps of at least 1 summing to under the file's words (checked in floats first, so that
    # hostile gaps cannot overflow the integer sum that places them).
    if n and (gaps.min() < 1 or gaps.sum(dtype=np.float64) > n_words or zigzag.max() >> 16):
        raise DeltaError("delta values out of range")
    positions = np.cumsum(gaps) - 1
    if n and positions[-1] >= n_words:
        raise DeltaError("delta positions out of range")
    diffs = (zigzag >> 1) ^ -(zigzag & 1)  # back from zigzag, -32768..32767
    return Changes(positions, diffs.astype(np.int16).view(WORD))


def _inflate(packed: memoryview, limit: int, what: str) -> bytes:
    """Decompress at most `limit` bytes: a hostile stream cannot balloon."""
    try:
        unpacker = zlib.decompressobj()
        raw = unpacker.decompress(packed, limit + 1)
    except zlib.error as exc:
        raise DeltaError(f"delta {what} do not decompress: {exc}") from None
    if len(raw) > limit or unpacker.unconsumed_tail or unpacker.unused_data or not unpacker.eof:
        raise DeltaError(f"delta {what} have the wrong length")
    return raw


def _varints(values: np.ndarray) -> bytes:
    """Non-negative integers (< 2**35) as LEB128: 7 bits a byte, the high bit set on all but a
    value's last byte. Most are one byte, so each further byte is a pass over fewer values."""
    v = values.astype(np.int64)
    nbytes = np.ones(v.size, np.int64)
    for k in range(1, _VARINT_MAX):
        nbytes += v >= (1 << (7 * k))
    at = np.cumsum(nbytes) - nbytes  # where each value's first byte goes
    out = np.empty(int(nbytes.sum()), np.uint8)
    for k in range(_VARINT_MAX):
        sel = np.flatnonzero(nbytes > k) if k else slice(None)
        more = (nbytes[sel] > k + 1).astype(np.uint8) << 7
        out[at[sel] + k] = ((v[sel] >> (7 * k)) & 0x7F).astype(np.uint8) | more
        if k and sel.size == 0:
            break
    return out.tobytes()


def _from_varints(raw: bytes, n: int, what: str) -> np.ndarray:
    """Exactly `n` varints from `raw`, each 1-5 bytes, nothing left over."""
    b = np.frombuffer(raw, np.uint8)
    ends = np.flatnonzero(b < 0x80)
    if ends.size != n or (n and ends[-1] != b.size - 1) or (not n and b.size):
        raise DeltaError(f"delta {what} are not {n} varints")
    if n == 0:
        return np.zeros(0, np.int64)
    lengths = np.diff(ends, prepend=-1)
    if lengths.max() > _VARINT_MAX:
        raise DeltaError(f"delta {what} hold an overlong varint")
    starts = ends - lengths + 1
    values = (b[starts] & 0x7F).astype(np.int64)
    for k in range(1, int(lengths.max())):
        sel = np.flatnonzero(lengths > k)
        values[sel] |= (b[starts[sel] + k] & 0x7F).astype(np.int64) << (7 * k)
    return values


def _words(data: bytes | memoryview) -> np.ndarray:
    """The bytes as little-endian 16-bit words, a zero byte appended to an odd length."""
    if len(data) % 2:
        data = bytes(data) + b"\0"
    return np.frombuffer(data, dtype=WORD)
