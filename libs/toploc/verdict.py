"""Thresholds, per-chunk statistics and the verdict a validator acts on."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from .bits import split_fields

REFERENCE_POINTS = 128
"""The published thresholds are counts out of 128 points; chunks with fewer points (tiny hidden
sizes, a short last chunk) get the same fraction, rounded down."""


class Thresholds(BaseModel):
    """Acceptance limits for one chunk. Defaults are the TOPLOC paper's, plus a sign check."""

    model_config = ConfigDict(frozen=True)

    max_exp_mismatches: int = Field(
        38,
        ge=0,
        description="Most points (of 128) whose bf16 exponent may differ. Honest recomputation "
        "differs mostly where the two top-k sets disagree at the boundary.",
    )
    max_sign_mismatches: int = Field(
        8,
        ge=0,
        description="Most points (of 128) with equal exponents but opposite signs. Large-magnitude "
        "values never flip sign under float noise, so honest chunks show ~0.",
    )
    max_mant_err_mean: float = Field(
        10.0,
        ge=0,
        description="Largest mean |mantissa difference| (7-bit bf16 mantissa, in units of one "
        "ulp) over points whose sign and exponent match.",
    )
    max_mant_err_median: float = Field(
        8.0,
        ge=0,
        description="Largest median |mantissa difference| over the same points.",
    )

    def scaled(self, limit: int, n_points: int) -> int:
        return limit * n_points // REFERENCE_POINTS


@dataclass(frozen=True)
class ChunkStats:
    """How one chunk's committed values compare with the validator's recomputation."""

    n_points: int
    exp_mismatches: int
    sign_mismatches: int
    mant_err_mean: float
    """inf when no point had a matching sign and exponent."""
    mant_err_median: float

    def failure(self, t: Thresholds) -> str | None:
        """Why this chunk fails ``t``, or None when it passes."""
        structural = self.structural_failure(t)
        if structural is not None:
            return structural
        if not self.mant_err_mean <= t.max_mant_err_mean:
            return f"mantissa error mean {self.mant_err_mean:.2f} > {t.max_mant_err_mean}"
        if not self.mant_err_median <= t.max_mant_err_median:
            return f"mantissa error median {self.mant_err_median:.2f} > {t.max_mant_err_median}"
        return None

    def structural_failure(self, t: Thresholds) -> str | None:
        """Why this chunk fails the exponent or sign limits (states that are not these ones),
        or None: what is left is mantissa noise, which a few near-zero points can inflate."""
        max_exp = t.scaled(t.max_exp_mismatches, self.n_points)
        if self.exp_mismatches > max_exp:
            return f"{self.exp_mismatches}/{self.n_points} exponent mismatches > {max_exp}"
        max_sign = t.scaled(t.max_sign_mismatches, self.n_points)
        if self.sign_mismatches > max_sign:
            return f"{self.sign_mismatches}/{self.n_points} sign mismatches > {max_sign}"
        return None


@dataclass(frozen=True)
class VerifyResult:
    """``ok`` is the verdict; ``reason`` says why not. ``chunks`` is empty when the proof could not
    be parsed or did not match the context, since no numbers were compared then."""

    ok: bool
    reason: str | None = None
    chunks: list[ChunkStats] = field(default_factory=list)

    @classmethod
    def reject(cls, reason: str) -> VerifyResult:
        return cls(ok=False, reason=reason)

    @property
    def n_points(self) -> int:
        return sum(c.n_points for c in self.chunks)


def pooled_chunk_err(chunks: Iterable[ChunkStats]) -> float:
    """Mean |mantissa difference| (ulps) over every compared point of `chunks`; inf when a chunk
    compared no point at all."""
    total = weight = 0.0
    for st in chunks:
        compared = st.n_points - st.exp_mismatches - st.sign_mismatches
        if compared <= 0 or not math.isfinite(st.mant_err_mean):
            return math.inf
        total += st.mant_err_mean * compared
        weight += compared
    return total / weight if weight else math.inf


def pooled_mant_err_mean(results: list[VerifyResult]) -> float:
    """Mean |mantissa difference| over every compared point of several proofs (a group's).

    Pooling thousands of points makes a small systematic shift visible (quantized or
    neighbouring weights move almost every point by a fraction of an ulp) where a per-chunk
    limit must leave room for one unlucky chunk. inf when a chunk compared no point at all.
    """
    return pooled_chunk_err(st for r in results for st in r.chunks)


def compare_rows(mine: np.ndarray, theirs: np.ndarray) -> list[ChunkStats]:
    """Statistics for each row of validator bits ``mine`` against decoded prover bits ``theirs``."""
    s_a, e_a, m_a = split_fields(mine)
    s_b, e_b, m_b = split_fields(theirs)
    same_exp = e_a == e_b
    exp_mis = (~same_exp).sum(axis=1)
    sign_mis = (same_exp & (s_a != s_b)).sum(axis=1)
    compared = same_exp & (s_a == s_b)
    counts = compared.sum(axis=1)
    diff = np.abs(m_a - m_b)
    means = np.where(compared, diff, 0).sum(axis=1) / np.maximum(counts, 1)
    # Median without nan-aware helpers: push uncompared points past the end, sort, pick middle.
    ordered = np.sort(np.where(compared, diff, 1 << 20), axis=1)
    lo = np.clip((counts - 1) // 2, 0, None)[:, None]
    hi = np.clip(counts // 2, 0, ordered.shape[1] - 1)[:, None]
    pair = np.take_along_axis(ordered, lo, axis=1) + np.take_along_axis(ordered, hi, axis=1)
    medians = pair[:, 0] / 2
    n_points = mine.shape[1]
    return [
        ChunkStats(
            n_points=n_points,
            exp_mismatches=int(exp_mis[i]),
            sign_mismatches=int(sign_mis[i]),
            mant_err_mean=float(means[i]) if counts[i] else math.inf,
            mant_err_median=float(medians[i]) if counts[i] else math.inf,
        )
        for i in range(mine.shape[0])
    ]
