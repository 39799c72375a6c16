"""Lossless deltas: exact round trips, small on sparse changes, refusals on bad input."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import zstandard

from prime_swarm.libs.shardcast import delta


def _z(raw: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=delta.ZSTD_LEVEL).compress(raw)


def _sparse_change(size: int, fraction: float, seed: int = 0) -> tuple[bytes, bytes]:
    rng = np.random.default_rng(seed)
    old = rng.integers(0, 2**16, size // 2, dtype=np.uint16)
    new = old.copy()
    at = rng.choice(old.size, int(fraction * old.size), replace=False)
    new[at] ^= rng.integers(1, 2**16, at.size, dtype=np.uint16)
    return old.tobytes(), new.tobytes()


@pytest.mark.parametrize("fraction", [0.0, 0.001, 0.01, 0.2, 1.0])
def test_round_trip_is_exact(fraction: float) -> None:
    old, new = _sparse_change(200_000, fraction)
    d = delta.encode(old, new)
    assert d is not None and delta.apply(old, d) == new


def test_one_percent_of_words_costs_under_two_percent_of_the_bytes() -> None:
    old, new = _sparse_change(2_000_000, 0.01)
    d = delta.encode(old, new)
    assert d is not None and len(d) < 0.02 * len(new)


def test_odd_lengths_and_tails() -> None:
    old = bytes(range(101)) * 3 + b"x"
    new = bytearray(old)
    new[-1] = ord("y")
    new[7] ^= 0xFF
    d = delta.encode(old, bytes(new))
    assert d is not None and delta.apply(old, d) == bytes(new)


@pytest.mark.parametrize("piece", [delta.BLOCK_BYTES, 2 * delta.BLOCK_BYTES])
def test_patching_piece_by_piece_equals_applying_at_once(piece: int) -> None:
    """How a client rebuilds a large file through one small buffer (`client._patch_through`):
    whole blocks, changes in every block, and an odd tail padded as the last piece."""
    old, new = _sparse_change(3 * delta.BLOCK_BYTES + 1000, 0.05)
    old, new = old + b"\x01", new + b"\x02"  # odd length, the last byte changed
    d = delta.encode(old, new)
    assert d is not None
    changes = delta.parse(d, len(old))
    rebuilt = bytearray()
    for offset in range(0, len(old), piece):
        part = bytearray(old[offset : offset + piece])
        part += b"\0" * (len(part) % 2)
        changes.patch(part, offset)
        rebuilt += part[: min(piece, len(old) - offset)]
    assert bytes(rebuilt) == new == delta.apply(old, d)


def _bf16_step(rng: np.random.Generator, follow_exponent: bool) -> tuple[bytes, bytes, int]:
    """bf16-like words whose changes fall, as after an RL step, mostly on small values (fine
    spacing: the same update crosses a rounding boundary more often), or, with the same count,
    anywhere."""
    exponent = rng.integers(100, 127, 2 * delta.BLOCK_WORDS).astype(np.uint16)
    old = (exponent << 7) | rng.integers(0, 128, exponent.size).astype(np.uint16)
    # Small values change 200x as often: position entropy 5 bits a change against 8 at random.
    p = np.where(exponent < 103, 0.1, 0.0005)
    changed = rng.random(old.size) < p
    if not follow_exponent:
        changed = np.zeros(old.size, bool)
        changed[rng.choice(old.size, int(p.sum()), replace=False)] = True
    new = old.copy()
    new[changed] += rng.choice(np.array([1, 65535], np.uint16), int(changed.sum()))
    return old.tobytes(), new.tobytes(), int(changed.sum())


def test_changes_that_follow_the_exponent_cost_less_than_changes_anywhere() -> None:
    """The codec's order: positions are coded by the parent's exponent class, so changes that
    bunch on small weights cost well under the same number of changes at random."""
    rng = np.random.default_rng(7)
    sizes = {}
    for follows in (True, False):
        old, new, n = _bf16_step(rng, follows)
        d = delta.encode(old, new)
        assert d is not None and delta.apply(old, d) == new
        sizes[follows] = len(d) / n
    assert sizes[True] < 0.8 * sizes[False], sizes


def test_no_delta_between_files_of_different_length() -> None:
    assert delta.encode(b"abcd", b"abcdef") is None


def test_a_delta_applies_only_to_its_parent_length() -> None:
    old, new = _sparse_change(1000, 0.1)
    d = delta.encode(old, new)
    assert d is not None
    with pytest.raises(delta.DeltaError, match="parent has"):
        delta.apply(old + b"xx", d)


@pytest.mark.parametrize(
    "mangle",
    [
        lambda d: d[:10],  # truncated header
        lambda d: b"NOPE" + d[4:],  # wrong magic
        lambda d: d[:-2],  # values cut short
        lambda d: d + b"\0\0",  # trailing bytes
    ],
)
def test_malformed_deltas_are_refused(mangle) -> None:  # noqa: ANN001
    old, new = _sparse_change(1000, 0.1)
    d = delta.encode(old, new)
    assert d is not None
    with pytest.raises(delta.DeltaError):
        delta.apply(old, mangle(d))


def test_positions_are_bounded_and_checked() -> None:
    old = bytes(1000)
    header = delta._HEADER
    plus_one = _z(delta._varints(np.array([2])))  # zigzag(+1)

    def with_gaps(gaps: bytes, n: int = 1) -> bytes:
        return header.pack(delta.MAGIC, len(old), n, len(gaps), len(plus_one)) + gaps + plus_one

    # A "zip bomb" claiming one change: its frame says 10 MB, more than 5 bytes: refused unread.
    with pytest.raises(delta.DeltaError, match="wrong length"):
        delta.apply(old, with_gaps(_z(b"\0" * 10_000_000)))
    # A gap that walks past the end of the file.
    with pytest.raises(delta.DeltaError, match="out of range"):
        delta.apply(old, with_gaps(_z(delta._varints(np.array([10_000])))))
    # A varint that never ends, and one longer than five bytes.
    with pytest.raises(delta.DeltaError, match="not 1 varints"):
        delta.apply(old, with_gaps(_z(b"\x83\x80")))
    long_gap = _z(b"\x81" * 5 + b"\x00" + b"\x01")  # 6 bytes, then 1
    two = _z(delta._varints(np.array([2, 2])))
    d = header.pack(delta.MAGIC, len(old), 2, len(long_gap), len(two)) + long_gap + two
    with pytest.raises(delta.DeltaError, match="overlong"):
        delta.apply(old, d)
    # A gap of 0 (two changes at one place) and gaps whose sum would overflow.
    with pytest.raises(delta.DeltaError, match="out of range"):
        delta.apply(old, with_gaps(_z(delta._varints(np.array([0])))))
    huge = _z(delta._varints(np.array([2**34, 2**34])))
    d = header.pack(delta.MAGIC, len(old), 2, len(huge), len(two)) + huge + two
    with pytest.raises(delta.DeltaError, match="out of range"):
        delta.apply(old, d)
    # The same with a gap in range applies: word 2 (bytes 4-5) goes up by one.
    d = with_gaps(_z(delta._varints(np.array([3]))))
    assert delta.apply(old, d) == bytes(4) + b"\1" + bytes(995)


def test_varints_round_trip_at_every_width() -> None:
    values = np.array([0, 1, 127, 128, 16383, 16384, 2**21, 2**28 - 1, 2**28, 2**35 - 1])
    raw = delta._varints(values)
    assert len(raw) == 1 + 1 + 1 + 2 + 2 + 3 + 4 + 4 + 5 + 5
    assert delta._from_varints(raw, values.size, "x").tolist() == values.tolist()


def test_the_changed_share_is_estimated_from_samples() -> None:
    old, new = _sparse_change(2_000_000, 0.01)
    assert delta.changed_share(old, new) == pytest.approx(0.01, abs=0.005)
    old, new = _sparse_change(2_000_000, 1.0)
    assert delta.changed_share(old, new) > 0.99
    assert delta.changed_share(old, old) == 0.0 and delta.changed_share(b"ab", b"abc") == 1.0


def test_small_nudges_cost_about_a_byte_a_change() -> None:
    """Values nudged across a rounding boundary by one unit in the last place, as bf16 weights
    after a small step: a difference of +-1 whatever the carries, so the delta costs little
    more than the positions' entropy (at 2 % changed: H(0.02)/0.02 = 7.1 bits) and the sign
    (1 bit): about a byte a change, where the earlier XOR codec paid 1.5."""
    rng = np.random.default_rng(1)
    old = rng.integers(0, 2**16, 1_000_000, dtype=np.uint16)
    new = old.copy()
    at = np.sort(rng.choice(old.size, 20_000, replace=False))
    new[at] += rng.choice(np.array([1, 65535], dtype=np.uint16), at.size)  # +-1 ulp
    d = delta.encode(old.tobytes(), new.tobytes())
    assert d is not None and delta.apply(old.tobytes(), d) == new.tobytes()
    assert len(d) < 1.15 * at.size


def test_frames_that_hide_their_size_or_carry_more_are_refused() -> None:
    old = bytes(1000)
    plus_one = _z(delta._varints(np.array([2])))
    gap = delta._varints(np.array([3]))

    def with_gaps(gaps: bytes) -> bytes:
        header = delta._HEADER.pack(delta.MAGIC, len(old), 1, len(gaps), len(plus_one))
        return header + gaps + plus_one

    unsized = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    hidden = unsized.compress(gap) + unsized.flush()
    with pytest.raises(delta.DeltaError, match="wrong length"):
        delta.apply(old, with_gaps(hidden))
    with pytest.raises(delta.DeltaError, match="do not decompress"):
        delta.apply(old, with_gaps(_z(gap) + b"\0"))
    with pytest.raises(delta.DeltaError, match="not a Zstandard frame"):
        delta.apply(old, with_gaps(b"\0\0\0"))
    assert delta.apply(old, with_gaps(_z(gap))) == bytes(4) + b"\1" + bytes(995)


def test_threads_and_files_give_the_same_delta(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks encoded on several threads, and two files read a piece at a time (the piece
    smaller than the file, an odd length at its end), make the bytes of the one-thread encode."""
    old, new = _sparse_change(3 * delta.BLOCK_BYTES + 1001, 0.02)
    one = delta.encode(old, new)
    assert one is not None and delta.encode(old, new, workers=3) == one
    (tmp_path / "a").write_bytes(old)
    (tmp_path / "b").write_bytes(new)
    monkeypatch.setattr(delta, "PIECE_BLOCKS", 2)
    body, parent_sha = delta.encode_files(tmp_path / "a", tmp_path / "b", workers=2)
    assert body == one and delta.apply(old, body) == new
    assert parent_sha == hashlib.sha256(old).hexdigest()
    assert delta.encode_files(tmp_path / "a", tmp_path / "a")[0] is not None
    (tmp_path / "c").write_bytes(old + b"x")
    assert delta.encode_files(tmp_path / "a", tmp_path / "c") == (None, "")


def test_the_kernels_follow_the_stable_exponent_order() -> None:
    """The compiled kernels' order is the definition's: a stable sort of the parent words by
    bits 7-14; the encode's ranks and the patch's positions agree with it word for word."""
    rng = np.random.default_rng(5)
    old = rng.integers(0, 2**16, 50_000, dtype=np.uint16)
    old[::7] = old[0]  # runs of one key, so that stability matters
    new = old.copy()
    at = rng.choice(old.size, 2_000, replace=False)
    new[at] += rng.integers(1, 2**16, at.size, dtype=np.uint16)
    order = np.argsort((old >> 7).astype(np.uint8), kind="stable")
    rank = np.empty(old.size, np.int64)
    rank[order] = np.arange(old.size)
    want = np.sort(rank[at])
    ranks, diffs = delta._block_changes(old, new, 0)
    assert ranks.tolist() == want.tolist()
    assert (old[order[ranks]] + diffs == new[order[ranks]]).all()
    block = old.copy()
    delta._kernels()[1](block, ranks, diffs)
    assert (block == new).all()
