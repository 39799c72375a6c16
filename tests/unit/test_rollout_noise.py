"""Seeded Gumbel noise: a pure function of (seed, sample, position), the same bits everywhere,
and a faithful Gumbel-max sampler."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from prime_swarm.libs.model import noise
from prime_swarm.libs.model.noise import (
    MAX_VOCAB,
    NOISE_TABLE_SIZE,
    build_table,
    exact_log,
    gumbel_rows,
    perturbed_scores,
    row_offset,
)

EULER_GAMMA = 0.5772156649015329
# Fixed forever by the pool (noise.py's "PRIME_SW" key): written out here, not imported, so a
# change of the key fails this file instead of silently moving every validator's noise.
TABLE_KEY = 0x5052494D455F5357
M64 = (1 << 64) - 1


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    return build_table()


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """Reference splitmix64 (Steele et al.), written independently of the library's."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _reference_table(indices: np.ndarray) -> np.ndarray:
    """-log(-log(u)) in float64 with libm's log."""
    raw = _splitmix64(indices.astype(np.uint64) + np.uint64(TABLE_KEY))
    u = ((raw >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
    return -np.log(-np.log(u))


def test_splitmix_reference_matches_a_scalar_implementation() -> None:
    # Guards the vectorised reference itself with Python's arbitrary-precision integers.
    def scalar(x: int) -> int:
        z = (x + 0x9E3779B97F4A7C15) & M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    xs = [0, 1, TABLE_KEY, M64, 12345678901234567]
    assert _splitmix64(np.array(xs, dtype=np.uint64)).tolist() == [scalar(x) for x in xs]


def test_table_matches_float64_numpy_gumbel(table: np.ndarray) -> None:
    assert table.dtype == np.float32 and table.shape == (NOISE_TABLE_SIZE,)
    expected = _reference_table(np.arange(NOISE_TABLE_SIZE))
    assert np.abs(table.astype(np.float64) - expected).max() <= 1e-6
    # A prefix of the table is the table of that size: entries do not depend on the size.
    assert np.array_equal(build_table(1000), table[:1000])


def test_table_is_standard_gumbel(table: np.ndarray) -> None:
    t = table.astype(np.float64)
    assert np.isfinite(t).all()
    assert abs(t.mean() - EULER_GAMMA) < 0.01
    assert abs(t.std() - math.pi / math.sqrt(6)) < 0.01
    # The median of a standard Gumbel is -log(log 2).
    assert abs(np.median(t) - (-math.log(math.log(2)))) < 0.01
    # The cut tail the module documents: no value beyond about 16.6.
    assert t.max() < 17.0


def test_exact_log_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    cases = [
        rng.random(200_000),  # uniforms, the table's first log
        -np.log(rng.random(200_000)),  # exponentials, its second
        np.exp(rng.uniform(-700, 700, 200_000)),  # the whole exponent range
        np.array([0.5, 2.0, math.sqrt(2), math.sqrt(0.5), 1e-300, 1e300, 5e-324 * 2**60]),
    ]
    for xs in cases:
        xs = xs[xs != 1.0]  # log(1) = 0 has no relative error; checked below
        got, ref = exact_log(xs), np.log(xs)
        assert np.all(np.abs(got - ref) <= 1e-15 * np.abs(ref))
    assert exact_log(np.array([1.0]))[0] == 0.0


def test_noise_is_a_pure_function_of_its_key() -> None:
    a = gumbel_rows([(12345, 3, 7)], 5)[0]
    assert a.dtype == torch.float32
    assert torch.equal(a, gumbel_rows([(12345, 3, 7)], 5)[0])
    # Pinned: a validator on any machine, in any language, must derive exactly these.
    assert row_offset(12345, 3, 7) == 132314
    assert row_offset(0, 0, 0) == 1532924
    pinned = [0.1519901156, 0.7905269861, 1.8460057974, -0.4027097523, -0.6091043950]
    assert a.tolist() == pytest.approx(pinned, abs=1e-7)
    for other in ((12346, 3, 7), (12345, 4, 7), (12345, 3, 8)):
        assert not torch.equal(a, gumbel_rows([other], 5)[0])
    # A larger vocabulary extends the same window rather than reshuffling it.
    assert torch.equal(gumbel_rows([(12345, 3, 7)], 9)[0, :5], a)
    big = gumbel_rows([(2**128 - 1, 0, 0)], 1000)[0]
    assert torch.isfinite(big).all()


def test_rows_read_the_table_at_their_hashed_offset(table: np.ndarray) -> None:
    rows = [(7, 0, 0), (7, 1, 0), (7, 0, 1), (8, 0, 0)]
    got = gumbel_rows(rows, 259)
    assert got.shape == (4, 259)
    for r, row in zip(rows, got, strict=True):
        start = row_offset(*r)
        assert np.array_equal(row.numpy(), table[start : start + 259])
    # Every row differs from every other.
    assert len({tuple(row.tolist()) for row in got}) == len(rows)
    # Within a row the values are distinct table entries, so the argmax is a Gumbel-max sample.
    assert len(set(got[0].tolist())) > 250


def test_windows_wrap_around_the_end_of_the_table(table: np.ndarray) -> None:
    vocab = 300
    seed = next(s for s in range(10**6) if row_offset(s, 0, 0) > NOISE_TABLE_SIZE - vocab)
    start = row_offset(seed, 0, 0)
    expected = np.concatenate([table[start:], table[: vocab - (NOISE_TABLE_SIZE - start)]])
    assert np.array_equal(gumbel_rows([(seed, 0, 0)], vocab)[0].numpy(), expected)


def test_noise_does_not_depend_on_torch_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [(s, j, k) for s in (1, 2**100) for j in range(3) for k in range(4)]
    threads = torch.get_num_threads()
    out = []
    try:
        for n in (1, 4):
            torch.set_num_threads(n)
            monkeypatch.setattr(noise, "_TABLES", {})  # rebuild the table under this setting
            out.append(gumbel_rows(rows, 259))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(out[0], out[1])


def test_gumbel_max_samples_the_softmax() -> None:
    # argmax(logits / T + g) over many independent rows must follow softmax(logits / T).
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    n = 20_000
    g = gumbel_rows([(99, j, 0) for j in range(n)], 4)
    for temperature in (1.0, 0.5):
        picks = perturbed_scores(logits, temperature, g).argmax(dim=-1)
        freq = torch.bincount(picks, minlength=4).double() / n
        target = torch.softmax(logits.double() / temperature, dim=-1)
        assert torch.allclose(freq, target, atol=0.015)


def test_perturbed_scores() -> None:
    logits = torch.tensor([1.0, 3.0, 2.0], dtype=torch.bfloat16)
    g = torch.tensor([0.0, 0.0, 1.5])
    assert torch.equal(perturbed_scores(logits, 0.0, g), logits.float())  # greedy ignores noise
    assert perturbed_scores(logits, 1.0, g).argmax() == 2  # 2 + 1.5 > 3
    assert perturbed_scores(logits, 0.5, g).argmax() == 1  # 6 > 4 + 1.5
    assert perturbed_scores(logits, 0.5, g).dtype == torch.float32


def test_bad_keys_and_vocab_sizes_are_refused() -> None:
    for seed, sample, pos in ((-1, 0, 0), (2**128, 0, 0), (0, -1, 0), (0, 0, -1)):
        with pytest.raises(ValueError):
            row_offset(seed, sample, pos)
    for vocab in (0, MAX_VOCAB + 1):
        with pytest.raises(ValueError):
            gumbel_rows([(0, 0, 0)], vocab)
    assert gumbel_rows([], 10).shape == (0, 10)
