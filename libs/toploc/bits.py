"""bf16 bit patterns of hidden states, chunking, and the deterministic top-k both sides share."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

CANONICAL_NAN = 0x7FC0
"""Every NaN is stored as this pattern: NaN payloads are not reproducible across kernels, and the
negative-NaN patterns >= 0xFFD9 are not elements of GF(65497)."""

SIGN_MASK = 0x8000
EXP_SHIFT = 7
EXP_MASK = 0xFF
MANT_MASK = 0x7F


def bf16_bits(hidden: torch.Tensor) -> np.ndarray:
    """Round ``hidden`` to bf16 and return its 16-bit patterns as int64 (NaNs canonicalized)."""
    if hidden.dtype != torch.bfloat16:
        hidden = hidden.detach().to(torch.bfloat16)
    raw = hidden.detach().cpu().contiguous().view(torch.int16).numpy()
    bits = raw.astype(np.int64) & 0xFFFF
    nan = (bits & 0x7F80) == 0x7F80
    nan &= (bits & MANT_MASK) != 0
    if nan.any():
        bits = np.where(nan, CANONICAL_NAN, bits)
    return bits


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

    def chunk_k(self, i: int) -> int:
        return min(self.topk, self.chunk_tokens(i) * self.hidden_size)

    def ks(self) -> list[int]:
        return [self.chunk_k(i) for i in range(self.n_chunks)]


def topk_indices(bits: np.ndarray, k: int) -> np.ndarray:
    """Flat indices of the ``k`` largest-magnitude values in each row of ``bits`` ([N, n]).

    Ties are broken towards the lower index, so the prover and the validator pick the same set
    whenever their values agree; torch.topk alone leaves tie order unspecified, and bf16 has many
    exact ties. The magnitude is the low 15 bits, which order like |value| for non-NaN bf16.
    """
    n = bits.shape[-1]
    if k >= n:
        return np.broadcast_to(np.arange(n, dtype=np.int64), bits.shape).copy()
    mag = torch.from_numpy(bits & 0x7FFF)
    # One int64 sort key: magnitude in the high bits, reversed index in the low 32 bits.
    key = (mag << 32) | (0xFFFFFFFF - torch.arange(n, dtype=torch.int64))
    return torch.topk(key, k, dim=-1, sorted=False).indices.numpy()


def split_fields(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sign, exponent, mantissa) of bf16 bit patterns."""
    return bits >> 15 & 1, bits >> EXP_SHIFT & EXP_MASK, bits & MANT_MASK
