"""bf16 bit patterns, chunk layout, and the deterministic top-k that prover and validator share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # select_topk imports it: the verdict side (verdict.py) needs no torch
    import torch

CANONICAL_NAN = 0x7FC0
"""Every NaN is stored as this pattern: NaN payloads are not reproducible across kernels, and the
negative-NaN patterns >= 0xFFD9 are not elements of GF(65497)."""

SIGN_MASK = 0x8000
EXP_SHIFT = 7
EXP_MASK = 0xFF
MANT_MASK = 0x7F


def canonical(bits: np.ndarray) -> np.ndarray:
    """Replace every NaN pattern by CANONICAL_NAN."""
    nan = ((bits & 0x7F80) == 0x7F80) & ((bits & MANT_MASK) != 0)
    return np.where(nan, CANONICAL_NAN, bits) if nan.any() else bits


@dataclass(frozen=True)
class ChunkLayout:
    """How ``n_tokens`` rows split into chunks of ``chunk_size`` tokens, and each chunk's k."""

    n_tokens: int
    hidden_size: int
    chunk_size: int
    topk: int

    @property
    def n_chunks(self) -> int:
        return -(-self.n_tokens // self.chunk_size)

    def chunk_tokens(self, i: int) -> int:
        return min(self.chunk_size, self.n_tokens - i * self.chunk_size)

    def runs(self) -> list[tuple[int, int, int]]:
        """(first_chunk, n_chunks, k): the full chunks, then the partial last chunk if any.

        Closed form rather than a per-chunk list, so a forged header cannot make us iterate.
        """
        n_full, rem = divmod(self.n_tokens, self.chunk_size)
        out = []
        if n_full:
            out.append((0, n_full, min(self.topk, self.chunk_size * self.hidden_size)))
        if rem:
            out.append((n_full, 1, min(self.topk, rem * self.hidden_size)))
        return out

    def proof_body_bytes(self) -> int:
        return sum(n * (2 + 2 * k) for _, n, k in self.runs())


def select_topk(rows: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    import torch

    """Flat indices ([N, k]) of the ``k`` largest-magnitude values of each bf16 row ([N, n]) and
    those values' bit patterns.

    Ties at the k-th magnitude go to the lowest indices, so prover and validator pick the same set
    whenever their values agree: torch.topk leaves tie order unspecified, and bf16 has many exact
    ties. Selection runs on int16 magnitudes (the low 15 bits order like |value| for non-NaN bf16)
    so the full rows are never widened; only the k winners are.
    """
    raw = rows.view(torch.int16)
    n = raw.shape[-1]
    if k >= n:
        idx = torch.arange(n, dtype=torch.int64).expand(raw.shape[0], n)
    else:
        mag = raw & 0x7FFF
        top = torch.topk(mag, k, dim=-1, sorted=True)
        kth = top.values[:, -1:]
        n_above = (top.values > kth).sum(dim=1)
        # Positions n_above..k-1 hold arbitrary ties at the k-th magnitude; refill them with the
        # lowest-index ties, found in row-major order by nonzero().
        tie_rows, tie_cols = (mag == kth).nonzero(as_tuple=True)
        per_row = torch.bincount(tie_rows, minlength=raw.shape[0])
        starts = torch.cumsum(per_row, 0) - per_row
        rank = torch.arange(tie_rows.numel()) - starts[tie_rows]
        keep = rank < (k - n_above)[tie_rows]
        idx = top.indices.clone()
        kept_rows = tie_rows[keep]
        idx[kept_rows, n_above[kept_rows] + rank[keep]] = tie_cols[keep]
    vals = torch.gather(raw, 1, idx).numpy().astype(np.int64) & 0xFFFF
    return idx.numpy(), canonical(vals)


def split_fields(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sign, exponent, mantissa) of bf16 bit patterns."""
    return bits >> 15 & 1, bits >> EXP_SHIFT & EXP_MASK, bits & MANT_MASK
