"""Arithmetic over the prime field GF(65497), vectorized with numpy int64.

Every function works on a leading batch of independent rows so that one call handles all the
chunks of many completions; the only Python loops run over the polynomial degree (at most
``topk``), never over points or chunks.

Values are kept in ``[0, P)``. The two hot loops (interpolation, evaluation) compute in float64:
every intermediate is an integer below 2**35, exact in a double, and `_reduce` takes it mod P
with a multiply and a floor instead of an integer division (1.4-1.8x faster here, results
identical; tests/unit/test_toploc_gf.py checks them against plain integer arithmetic).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

P = 65497
"""TOPLOC's prime, just below 2**16: x-coordinates (index mod m, m <= P) are field elements, and so
is every bf16 bit pattern except the negative NaNs >= 0xFFD9, which callers canonicalize first."""


def _pow_mod(base: np.ndarray, exponent: int) -> np.ndarray:
    """Elementwise ``base ** exponent mod P`` by square-and-multiply over the exponent's bits."""
    result = np.ones_like(base, dtype=np.int64)
    acc = base.astype(np.int64) % P
    e = exponent
    while e:
        if e & 1:
            result = result * acc % P
        acc = acc * acc % P
        e >>= 1
    return result


@lru_cache(maxsize=1)
def inverse_table() -> np.ndarray:
    """Multiplicative inverse of every field element (entry 0 is 0, the caller's bug if used).

    A 512 KiB table turns every inversion on the hot path into one gather, which is far cheaper
    than a per-element Fermat exponentiation.
    """
    table = _pow_mod(np.arange(P, dtype=np.int64), P - 2)
    table.setflags(write=False)
    return table


def interpolate(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Coefficients (lowest degree first) of the polynomial of degree < k through each row's points.

    ``xs`` and ``ys`` have shape ``[..., k]``; each row's ``xs`` must be distinct field elements
    (the caller guarantees this by its choice of modulus). Newton divided differences, then the
    Newton form is expanded to the monomial basis: O(k^2) work, k vector steps each way.
    """
    if xs.shape != ys.shape or xs.ndim < 1:
        raise ValueError(f"xs {xs.shape} and ys {ys.shape} must share a shape [..., k]")
    inv = inverse_table()
    xi = xs.astype(np.int64) % P
    x = xi.astype(np.float64)
    c = (ys.astype(np.int64) % P).astype(np.float64)
    k = x.shape[-1]
    # Divided differences in place: the right-hand side is evaluated before assignment, so each
    # level reads the previous level's values as the recurrence requires. (c_j - c_{j-1} + P)
    # stays positive and below 2P, times an inverse below P: below 2**34.
    for j in range(1, k):
        d = c[..., j:] - c[..., j - 1 : k - 1]
        d += P
        d *= inv[(xi[..., j:] - xi[..., :-j]) % P]
        c[..., j:] = _reduce(d)

    # Expand c0 + (x-x0)(c1 + (x-x1)(c2 + ...)) from the innermost factor outwards; before the
    # step for x_j the polynomial has degree k-2-j, so only its first k-1-j terms are touched.
    coeffs = np.zeros_like(c)
    coeffs[..., 0] = c[..., k - 1]
    neg_x = (P - x) % P
    for j in range(k - 2, -1, -1):
        n = k - 1 - j
        new = coeffs[..., : n + 1] * neg_x[..., j : j + 1]
        new[..., 1:] += coeffs[..., :n]
        new[..., 0] += c[..., j]
        coeffs[..., : n + 1] = _reduce(new)
    return coeffs.astype(np.int64)


def _reduce(a: np.ndarray) -> np.ndarray:
    """``a mod P`` in place for float64 integers 0 <= a < 2**40. floor((a + 1/2) / P) is the
    exact quotient: (r + 1/2) / P stays 1/(2P) away from an integer, far above the rounding of
    a double at this size."""
    q = np.floor((a + 0.5) * _INV_P)
    q *= P
    a -= q
    return a


_INV_P = 1.0 / P


def evaluate(coeffs: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Evaluate each row's polynomial (``[..., k]``, lowest degree first) at that row's ``xs``
    (``[..., n]``) by Horner's rule, vectorized over rows and points."""
    c = (coeffs.astype(np.int64) % P).astype(np.float64)
    x = (xs.astype(np.int64) % P).astype(np.float64)
    k = c.shape[-1]
    result = np.broadcast_to(c[..., k - 1 : k], x.shape).copy()
    for j in range(k - 2, -1, -1):
        result *= x
        result += c[..., j : j + 1]
        _reduce(result)
    return result.astype(np.int64)
