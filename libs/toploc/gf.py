"""Arithmetic over the prime field GF(65497), vectorized with numpy int64.

Every function works on a leading batch of independent rows so that one call handles all the
chunks of many completions; the only Python loops run over the polynomial degree (at most
``topk``), never over points or chunks.

Values are kept in ``[0, P)``. Products of two such values stay below 2**32, so int64 never
overflows as long as we reduce after each multiply-add.
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
    x = xs.astype(np.int64) % P
    c = ys.astype(np.int64) % P
    k = x.shape[-1]
    # Divided differences in place: the right-hand side is evaluated before assignment, so each
    # level reads the previous level's values as the recurrence requires.
    for j in range(1, k):
        denom = inv[(x[..., j:] - x[..., :-j]) % P]
        c[..., j:] = (c[..., j:] - c[..., j - 1 : k - 1]) % P * denom % P

    # Expand c0 + (x-x0)(c1 + (x-x1)(c2 + ...)) from the innermost factor outwards.
    coeffs = np.zeros_like(c)
    coeffs[..., 0] = c[..., k - 1]
    for j in range(k - 2, -1, -1):
        xj = x[..., j : j + 1]
        shifted = np.zeros_like(coeffs)
        shifted[..., 1:] = coeffs[..., :-1]
        coeffs = (shifted - xj * coeffs) % P
        coeffs[..., 0] = (coeffs[..., 0] + c[..., j]) % P
    return coeffs


def evaluate(coeffs: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Evaluate each row's polynomial (``[..., k]``, lowest degree first) at that row's ``xs``
    (``[..., n]``) by Horner's rule, vectorized over rows and points."""
    c = coeffs.astype(np.int64) % P
    x = xs.astype(np.int64) % P
    k = c.shape[-1]
    result = np.broadcast_to(c[..., k - 1 : k], x.shape).copy()
    for j in range(k - 2, -1, -1):
        result = (result * x + c[..., j : j + 1]) % P
    return result
