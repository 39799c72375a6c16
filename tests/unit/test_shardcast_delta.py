"""Lossless deltas: exact round trips, small on sparse changes, refusals on bad input."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from prime_swarm.libs.shardcast import delta


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


@pytest.mark.parametrize("piece", [2, 4096, 10_000])
def test_patching_piece_by_piece_equals_applying_at_once(piece: int) -> None:
    """How a client rebuilds a large file through one small buffer (`client._patch_through`):
    changes on both sides of every cut, and an odd tail padded as the last piece."""
    old, new = _sparse_change(50_000, 0.05)
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
    xors = zlib.compress(delta._split_planes(np.array([1], dtype="<u2")))
    # A "zip bomb" claiming one change: decompression stops at 4 bytes and is refused.
    bomb = zlib.compress(b"\0" * 10_000_000)
    d = header.pack(delta.MAGIC, len(old), 1, len(bomb), len(xors)) + bomb + xors
    with pytest.raises(delta.DeltaError, match="wrong length"):
        delta.apply(old, d)
    # A gap that walks past the end of the file.
    gaps = zlib.compress(delta._split_planes(np.array([10_000], dtype="<u4")))
    d = header.pack(delta.MAGIC, len(old), 1, len(gaps), len(xors)) + gaps + xors
    with pytest.raises(delta.DeltaError, match="out of range"):
        delta.apply(old, d)
    # The same with a gap in range applies.
    gaps = zlib.compress(delta._split_planes(np.array([3], dtype="<u4")))
    d = header.pack(delta.MAGIC, len(old), 1, len(gaps), len(xors)) + gaps + xors
    assert delta.apply(old, d) == bytes(4) + b"\1" + bytes(995)


def test_the_changed_share_is_estimated_from_samples() -> None:
    old, new = _sparse_change(2_000_000, 0.01)
    assert delta.changed_share(old, new) == pytest.approx(0.01, abs=0.005)
    old, new = _sparse_change(2_000_000, 1.0)
    assert delta.changed_share(old, new) > 0.99
    assert delta.changed_share(old, old) == 0.0 and delta.changed_share(b"ab", b"abc") == 1.0


def test_small_nudges_compress_below_two_bytes_a_change() -> None:
    """Values nudged across a rounding boundary, as bf16 weights after a small step: the XOR
    sits in the low bits and the delta costs less than two bytes per changed word."""
    rng = np.random.default_rng(1)
    old = rng.integers(0, 2**16, 1_000_000, dtype=np.uint16)
    new = old.copy()
    at = np.sort(rng.choice(old.size, 20_000, replace=False))
    new[at] += rng.choice(np.array([1, 65535], dtype=np.uint16), at.size)  # +-1 ulp
    d = delta.encode(old.tobytes(), new.tobytes())
    assert d is not None and delta.apply(old.tobytes(), d) == new.tobytes()
    assert len(d) < 2 * at.size
