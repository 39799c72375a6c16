"""Field arithmetic over GF(65497): interpolation and evaluation agree, batched and not."""

import numpy as np
import pytest

from prime_swarm.libs.toploc import gf
from prime_swarm.libs.toploc.proof import find_moduli


def test_inverse_table_inverts_every_nonzero_element() -> None:
    inv = gf.inverse_table()
    a = np.arange(1, gf.P, dtype=np.int64)
    assert np.all(a * inv[1:] % gf.P == 1)


@pytest.mark.parametrize("k", [1, 2, 7, 128])
def test_interpolation_passes_through_every_point(k: int) -> None:
    rng = np.random.default_rng(k)
    xs = np.stack([rng.choice(gf.P, k, replace=False) for _ in range(5)])
    ys = rng.integers(0, gf.P, (5, k))
    coeffs = gf.interpolate(xs, ys)
    assert coeffs.shape == (5, k)
    assert np.all((coeffs >= 0) & (coeffs < gf.P))
    assert np.array_equal(gf.evaluate(coeffs, xs), ys)


def test_batched_interpolation_matches_row_by_row() -> None:
    rng = np.random.default_rng(1)
    xs = np.stack([rng.choice(gf.P, 16, replace=False) for _ in range(4)])
    ys = rng.integers(0, gf.P, (4, 16))
    batched = gf.interpolate(xs, ys)
    for i in range(4):
        assert np.array_equal(batched[i], gf.interpolate(xs[i : i + 1], ys[i : i + 1])[0])


def test_evaluate_matches_direct_sum() -> None:
    rng = np.random.default_rng(2)
    coeffs = rng.integers(0, gf.P, (1, 10))
    xs = rng.integers(0, gf.P, (1, 50))
    want = [
        sum(int(c) * pow(int(x), j, gf.P) for j, c in enumerate(coeffs[0])) % gf.P for x in xs[0]
    ]
    assert gf.evaluate(coeffs, xs)[0].tolist() == want


def test_modulus_search_separates_colliding_indices() -> None:
    rng = np.random.default_rng(3)
    idx = rng.choice(32 * 4096, (3, 128), replace=False)
    idx[1, :2] = [5, 5 + gf.P]  # collide mod P, so row 1 must search below P
    moduli = find_moduli(idx)
    assert moduli[0] == gf.P or len(set((idx[0] % gf.P).tolist())) < 128
    assert moduli[1] < gf.P
    for row, m in zip(idx, moduli, strict=True):
        assert len(set((row % m).tolist())) == 128
        # Largest such m: every candidate above it collides.
        for above in range(int(m) + 1, gf.P + 1):
            assert len(set((row % above).tolist())) < 128


def test_float_reduction_is_exact_at_multiples_of_p_and_at_the_bound() -> None:
    # The float64 loops take values mod P by a multiply and a floor: exact multiples (where a
    # rounded quotient would land one below) and the largest intermediates must come out exact.
    ints = np.array(
        [0, 1, gf.P - 1, gf.P, gf.P + 1, 2 * gf.P, gf.P * gf.P, 2 * gf.P * (gf.P - 1), 2**40 - 1]
        + [q * gf.P + r for q in (12345, 65496, 2**23) for r in (0, 1, gf.P - 1)],
        dtype=np.int64,
    )
    assert np.array_equal(gf._reduce(ints.astype(np.float64)).astype(np.int64), ints % gf.P)


def test_extreme_points_interpolate_exactly() -> None:
    # The largest field elements everywhere: every product and difference at its maximum.
    xs = np.arange(gf.P - 128, gf.P, dtype=np.int64)[None, :]
    ys = np.full((1, 128), gf.P - 1, dtype=np.int64)
    coeffs = gf.interpolate(xs, ys)
    assert np.array_equal(gf.evaluate(coeffs, xs), ys)
    want = [
        sum(int(c) * pow(int(x), j, gf.P) for j, c in enumerate(coeffs[0])) % gf.P
        for x in xs[0, :5]
    ]
    assert gf.evaluate(coeffs, xs[:, :5])[0].tolist() == want
