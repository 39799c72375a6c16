"""Lossless deltas between two versions of one file: the 16-bit words that changed, where, and by
how much.

An RL step at a small learning rate, with fp32 master weights published in bf16, leaves most
bf16 values bit-identical, so a new version differs from its parent in a small fraction of its
16-bit words, and a changed value has mostly moved by one unit in the last place. A delta stores
where the changed words are and, for each, its difference from the old word as a 16-bit integer
(new - old, wrapping): a bf16 value nudged to its neighbour differs by +-1 there, whatever its
bits (an XOR of the two flips a run of low bits on every carry).

Where the changes fall is predictable from the parent, which the receiver holds: an update of a
given size crosses a bf16 rounding boundary far more often on a small weight (fine spacing) than
on a large one, so the chance that a word changed depends on its exponent. The codec therefore
walks each block of `BLOCK_WORDS` words in the order of the parent words' bits 7-14 (a bf16
value's exponent; a stable sort, so ties keep their places) and records changes in that order:
changes bunch by exponent class, and the gaps between them and the differences (similar within
a class) compress to about half. Measured on 8 real RL steps of SmolLM2-135M
(bench/results/wan.json `deltas`): the position entropy given the exponent was 0.25-0.6 of
the unconditioned one. The receiver recomputes the same order from its own parent block before
patching it.

Gaps between changed positions (in that order) and zigzagged differences are LEB128 varints
(most take one byte), each stream compressed with Zstandard (level `ZSTD_LEVEL`). LZMA (xz preset
6), this codec's compressor until PSD5, made the streams 14 % smaller on SmolLM2's step and cost
175x the time: 10.6 s of a 13.8 s encode of one 269 MB version, where zstd takes 0.06 s
(`make bench-weights` times every stage). Blocks are independent until the varints, so encode
and rebuild split over threads (the two kernels are compiled by numba and release the GIL).
Words, not elements, keep it dtype-agnostic: the safetensors header and fp32 tensors go through
the same path (for them the "exponent" is mantissa bits: a different, still lossless, order).

Deltas come from relays; their bytes are checked against the signed manifest before `apply`
runs, and the rebuilt file is checked against the signed hash of the full file after. `parse`
still decodes defensively (bounded decompression and decoder memory, every varint and position
checked): a trainer bug must not become a crash or an out-of-bounds write.
"""

from __future__ import annotations

import functools
import hashlib
import mmap
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zstandard

# PSD4 compressed with LZMA: a delta of another magic is refused (DeltaError) and the client
# fetches the full file instead, so a pool mixing releases only loses the shortcut.
MAGIC = b"PSD5"
# magic, file length in bytes, changed words, packed gap bytes, packed difference bytes
_HEADER = struct.Struct("<4sQQQQ")
WORD = np.dtype("<u2")
BLOCK_WORDS = 1 << 21
"""Words ordered together (4 MiB): a rebuild patches the parent a whole block at a time, and a
block's order costs a pass over its words (`_ranks_of_changes`, `_patch_block`)."""
BLOCK_BYTES = BLOCK_WORDS * WORD.itemsize
ZSTD_LEVEL = 3
"""Measured on SmolLM2's two streams (15.3 MB of varints): level 3 5.39 MB in 0.06 s, 9 5.27 MB
in 0.28 s, 19 4.73 MB in 8.5 s; xz preset 6 4.64 MB in 10.6 s. The encode sits on the trainer's
path to every version, before the manifest exists."""
# Decoder memory a delta may ask for: level 3 opens a window of at most 8 MiB; a hostile frame
# can ask for 2 GiB.
_ZSTD_MAX_WINDOW = 64 << 20
PIECE_BLOCKS = 4
"""Blocks read from each file at once by `encode_files`, at least one per thread: the work of a
batch of threads, and with the batch before it all the file bytes an encode holds (at 4 and two
threads, 64 MiB)."""
_VARINT_MAX = 5  # bytes of a varint up to 2**35: gaps are under 2**32, differences 2**16


class DeltaError(ValueError):
    """A delta that does not apply to the given parent."""


def encode(parent: bytes | memoryview, new: bytes | memoryview, workers: int = 1) -> bytes | None:
    """The delta turning `parent` into `new`, or None when none applies (lengths differ)."""
    if len(parent) != len(new):
        return None
    old_w, new_w = _words(parent), _words(new)
    starts = range(0, old_w.size, BLOCK_WORDS)
    with ThreadPoolExecutor(max(1, workers)) as pool:
        found = list(
            pool.map(
                lambda at: _block_changes(
                    old_w[at : at + BLOCK_WORDS], new_w[at : at + BLOCK_WORDS], at
                ),
                starts,
            )
        )
    return _pack(len(new), found)


def encode_files(
    parent: Path, new: Path, workers: int = 1, parent_sha256: str | None = None
) -> tuple[bytes | None, str]:
    """`encode` of two files of one length through mappings, a piece at a time (`PIECE_BLOCKS`
    blocks, at least one a thread), each piece's pages handed back once it is done: no copy of
    the files and never more of them resident than a few pieces. Also the parent's sha256,
    from the same pages, unless the caller knows it (`parent_sha256`: the trainer published
    the parent; hashing it again was a quarter of the encode)."""
    size = new.stat().st_size
    if parent.stat().st_size != size:
        return None, ""
    if size == 0:
        return _pack(0, []), parent_sha256 or hashlib.sha256().hexdigest()
    digest = hashlib.sha256()
    found: list[tuple[np.ndarray, np.ndarray]] = []
    piece = max(PIECE_BLOCKS, workers) * BLOCK_BYTES
    with (
        open(parent, "rb") as a,
        open(new, "rb") as b,
        mmap.mmap(a.fileno(), 0, access=mmap.ACCESS_READ) as ma,
        mmap.mmap(b.fileno(), 0, access=mmap.ACCESS_READ) as mb,
        ThreadPoolExecutor(max(1, workers) + 1) as pool,
    ):
        for offset in range(0, size, piece):
            n = min(piece, size - offset)
            with memoryview(ma)[offset : offset + n] as old_p:
                # hashlib releases the GIL: the hash runs beside the kernels.
                hashed = pool.submit(digest.update, old_p) if parent_sha256 is None else None
                with memoryview(mb)[offset : offset + n] as new_p:
                    found += _piece_changes(pool, _words(old_p), _words(new_p), offset)
                if hashed is not None:
                    hashed.result()
            for m in (ma, mb):  # read once: the pages go back, not the next piece's
                m.madvise(mmap.MADV_DONTNEED, offset, n)
    return _pack(size, found), parent_sha256 or digest.hexdigest()


def _piece_changes(
    pool: ThreadPoolExecutor, old_w: np.ndarray, new_w: np.ndarray, offset: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The changes of a piece's blocks, a block a thread, in file order."""
    first = offset // WORD.itemsize
    return list(
        pool.map(
            lambda at: _block_changes(
                old_w[at : at + BLOCK_WORDS], new_w[at : at + BLOCK_WORDS], first + at
            ),
            range(0, old_w.size, BLOCK_WORDS),
        )
    )


def _block_changes(
    old_b: np.ndarray, new_b: np.ndarray, start: int
) -> tuple[np.ndarray, np.ndarray]:
    """One block's changed words as (their ranks in the codec's order plus `start`, ascending;
    new - old for each, wrapping)."""
    ranks, diffs = _kernels()[0](old_b, new_b)
    by_rank = np.argsort(ranks)  # a few per cent of the block
    return ranks[by_rank] + start, diffs[by_rank]


@functools.cache
def _kernels() -> tuple:
    """The two kernels compiled by numba on first use (the compiled code is cached on disk):
    importing numba costs 150 MB of memory and a second, which a process that never builds or
    applies a delta should not pay."""
    import numba

    compile_ = numba.njit(nogil=True, cache=True)
    return compile_(_ranks_of_changes), compile_(_patch_block)


def _ranks_of_changes(old: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The codec's order without sorting the block: a word's rank is the count of words with a
    smaller key, plus those with its key before it. One pass notes each changed word's key and
    how many of its key came before; the counts of smaller keys are added after. No GIL; numpy's
    stable radix argsort of the same keys, and the gathers around it, ran at 71 MB/s against
    this kernel's 372 MB/s in two passes (one core, a busy machine)."""
    seen = np.zeros(256, np.int64)
    keys = np.empty(old.size, np.uint8)
    ranks = np.empty(old.size, np.int64)
    diffs = np.empty(old.size, np.uint16)
    j = 0
    for i in range(old.size):
        k = (old[i] >> 7) & 0xFF
        if old[i] != new[i]:
            keys[j], ranks[j], diffs[j] = k, seen[k], new[i] - old[i]
            j += 1
        seen[k] += 1
    first = np.zeros(256, np.int64)
    for k in range(1, 256):
        first[k] = first[k - 1] + seen[k - 1]
    for c in range(j):
        ranks[c] += first[keys[c]]
    return ranks[:j].copy(), diffs[:j].copy()


def _patch_block(block: np.ndarray, ranks: np.ndarray, diffs: np.ndarray) -> None:
    """Add `diffs` to the words of `block` at `ranks` (ascending) in the codec's order, in one
    pass: each key's ranks are a run of `ranks`, met in file order."""
    first = np.zeros(257, np.int64)
    for i in range(block.size):
        first[((block[i] >> 7) & 0xFF) + 1] += 1
    for k in range(256):
        first[k + 1] += first[k]
    wanted = np.searchsorted(ranks, first[:256])  # each key's next rank to patch
    last = np.searchsorted(ranks, first[1:])
    seen = first[:256].copy()
    for i in range(block.size):
        k = (block[i] >> 7) & 0xFF
        w = wanted[k]
        if w < last[k] and ranks[w] == seen[k]:
            block[i] += diffs[w]  # uint16: wraps as encoded
            wanted[k] = w + 1
        seen[k] += 1


def _pack(length: int, found: list[tuple[np.ndarray, np.ndarray]]) -> bytes:
    changed = np.concatenate([w for w, _ in found]) if found else np.zeros(0, np.int64)
    moved = np.concatenate([d for _, d in found]) if found else np.zeros(0, WORD)
    diffs = moved.view(np.int16).astype(np.int64)
    gaps = np.diff(changed, prepend=-1)  # >= 1 each; the first from -1
    streams = [_varints(gaps), _varints((diffs << 1) ^ (diffs >> 63))]  # differences zigzagged
    # One thread: zstd's threaded frames differ with the thread count, and the delta should be
    # the same bytes wherever it is made; at this level the streams take a few per cent of the
    # encode.
    zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    packed, moved_packed = (zstd.compress(raw) for raw in streams)
    header = _HEADER.pack(MAGIC, length, len(changed), len(packed), len(moved_packed))
    return header + packed + moved_packed


def changed_words(delta: bytes | memoryview) -> int:
    """How many words a delta changes, from its header (0: the files were equal)."""
    return _HEADER.unpack_from(delta)[2]


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
"""What a changed word costs in a delta at most, above the measured 0.5-1.2 (SmolLM2 and a
104M Qwen2 in bf16, lr 5e-6 and 1e-6) and 1.6-2 (random positions and values, tests): the
estimate that decides whether to encode."""


def apply(parent: bytes | memoryview, delta: bytes | memoryview) -> bytes:
    """`parent` with the delta's changes applied: the new file."""
    buf = bytearray(len(parent) + len(parent) % 2)
    buf[: len(parent)] = parent
    parse(delta, len(parent)).patch(buf, 0)
    return bytes(memoryview(buf)[: len(parent)])


@dataclass(frozen=True)
class Changes:
    """A parsed delta: the changed words' positions in the codec's order (ascending; each block
    of `BLOCK_WORDS` words keeps its own positions) and what to add to each parent word
    (mod 2**16). Applied a block at a time, a multi-GB file is rebuilt through one small
    buffer."""

    positions: np.ndarray
    diffs: np.ndarray
    words: int  # of the file, its last word padded

    def patch(self, piece: bytearray | memoryview, offset: int) -> None:
        """Apply, in place, the changes that fall in `piece`: the parent's bytes from `offset`,
        whole blocks (the file's last one may be short; an odd-sized file's last piece padded
        with a zero byte). Each block's order is read from the parent bytes before they
        change."""
        first = offset // WORD.itemsize
        words = np.frombuffer(piece, dtype=WORD)
        if offset % BLOCK_BYTES or (words.size % BLOCK_WORDS and first + words.size != self.words):
            raise ValueError("a delta patches whole blocks")
        lo, hi = np.searchsorted(self.positions, (first, first + words.size))
        for start in range(0, words.size, BLOCK_WORDS):
            end = np.searchsorted(self.positions[lo:hi], first + start + BLOCK_WORDS) + lo
            if end == lo:
                continue
            block = words[start : start + BLOCK_WORDS]
            patch = _kernels()[1]
            patch(block, self.positions[lo:end] - first - start, self.diffs[lo:end])
            lo = end


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
    # Within each block a position is a rank in the block's order: no two alike.
    diffs = (zigzag >> 1) ^ -(zigzag & 1)  # back from zigzag, -32768..32767
    return Changes(positions, diffs.astype(np.int16).view(WORD), n_words)


def _inflate(packed: memoryview, limit: int, what: str) -> bytes:
    """Decompress at most `limit` bytes with bounded decoder memory: a hostile stream cannot
    balloon. The frame must say its size (our encoder writes it) and hold nothing after it."""
    try:
        declared = zstandard.frame_content_size(packed)
    except zstandard.ZstdError:
        raise DeltaError(f"delta {what} are not a Zstandard frame") from None
    if declared < 0 or declared > limit:  # negative: the frame does not say
        raise DeltaError(f"delta {what} have the wrong length")
    try:
        unpacker = zstandard.ZstdDecompressor(max_window_size=_ZSTD_MAX_WINDOW)
        raw = unpacker.decompress(packed, max_output_size=limit, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise DeltaError(f"delta {what} do not decompress: {exc}") from None
    if len(raw) != declared:
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
