"""What a proof is bound to, and the keyed mask that ties the stored values to it.

Binding works twice over:
1. the proof header carries a truncated sha256 of the context, so a proof presented for another
   context is rejected up front with a clear reason;
2. every committed value is shifted by a keyed pseudo-random mask derived from the full digest and
   the chunk index, so a proof whose header alone was rewritten decodes to noise and fails the
   numeric check as well.
Neither is a secret: anyone who knows both contexts and the proof could re-mask it. What binding
buys is that a proof cannot be replayed verbatim for other tokens, another lease or another model,
and that swapping chunks within a proof fails.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .gf import P

DIGEST_BYTES = 16
_DOMAIN = b"prime-swarm/toploc/v1\x00"


@dataclass(frozen=True)
class ProofContext:
    """The rollout a proof speaks for."""

    model_hash: str
    """Model hash of the policy version the worker claims to have used (from its manifest)."""
    lease_id: str
    """Orchestrator lease the rollout answers."""
    sample_index: int
    """Index of this completion within the lease's group."""
    token_ids: list[int] = field(default_factory=list)
    """Generated token ids whose hidden states are committed."""

    def digest(self) -> bytes:
        """sha256 over an unambiguous encoding (length-prefixed strings, fixed-width ints)."""
        if not 0 <= self.sample_index < 2**32:
            raise ValueError(f"sample_index {self.sample_index} out of uint32 range")
        h = hashlib.sha256(_DOMAIN)
        for text in (self.model_hash, self.lease_id):
            raw = text.encode("utf-8")
            h.update(struct.pack("<I", len(raw)))
            h.update(raw)
        h.update(struct.pack("<II", self.sample_index, len(self.token_ids)))
        ids = np.asarray(self.token_ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= 2**32):
            raise ValueError("token ids must fit in uint32")
        h.update(ids.astype("<u4").tobytes())
        return h.digest()


def group_contexts(
    model_hash: str, lease_id: str, completions: Sequence[Sequence[int]]
) -> list[ProofContext]:
    """The contexts of a lease's group, completion i at sample index i: the worker proves and the
    validator verifies with exactly these, so both sides build them here."""
    return [
        ProofContext(model_hash=model_hash, lease_id=lease_id, sample_index=i, token_ids=list(t))
        for i, t in enumerate(completions)
    ]


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer: a cheap, well-mixed 64-bit permutation (uint64 wraps by design)."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def key_base(digest: bytes) -> int:
    """The 64-bit seed of a context's masks."""
    return int.from_bytes(digest[:8], "little")


def chunk_keys(bases: np.ndarray, chunk_indices: np.ndarray) -> np.ndarray:
    """One 64-bit key per chunk (``bases`` from key_base, one per chunk row), so identical hidden
    states in two chunks or two contexts commit differently."""
    idx = chunk_indices.astype(np.uint64)
    with np.errstate(over="ignore"):
        mixed = _splitmix64(idx + np.uint64(0x9E3779B97F4A7C15))
        return _splitmix64(bases.astype(np.uint64) ^ mixed)


def value_mask(keys: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Mask in [0, P) for each x-coordinate; ``keys`` is [N], ``xs`` is [N, k]."""
    with np.errstate(over="ignore"):
        z = _splitmix64(keys[:, None] ^ (xs.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)))
    return (z % np.uint64(P)).astype(np.int64)
