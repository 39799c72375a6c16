"""TOPLOC: locality-sensitive proofs that a completion was generated with the claimed weights.

Public API::

    build_proof(hidden, context) -> bytes
    verify_proof(hidden, proof, context, thresholds=Thresholds()) -> VerifyResult
    build_proofs_batch / verify_proofs_batch  (many completions at once)
"""

from .codec import HEADER_BYTES, ProofFormatError
from .context import ProofContext, group_contexts
from .proof import (
    CHUNK_SIZE,
    TOPK,
    build_proof,
    build_proofs_batch,
    compare_hidden,
    verify_proof,
    verify_proofs_batch,
)
from .verdict import ChunkStats, Thresholds, VerifyResult, pooled_chunk_err, pooled_mant_err_mean

__all__ = [
    "CHUNK_SIZE",
    "HEADER_BYTES",
    "TOPK",
    "ChunkStats",
    "ProofContext",
    "group_contexts",
    "ProofFormatError",
    "Thresholds",
    "VerifyResult",
    "build_proof",
    "build_proofs_batch",
    "compare_hidden",
    "verify_proof",
    "pooled_chunk_err",
    "pooled_mant_err_mean",
    "verify_proofs_batch",
]
