"""TOPLOC: locality-sensitive proofs that a completion was generated with the claimed weights.

Public API::

    build_proof(hidden, context) -> bytes
    verify_proof(hidden, proof, context, thresholds=Thresholds()) -> VerifyResult
    build_proofs_batch / verify_proofs_batch  (many completions at once)

Names load on first use (PEP 562): `Thresholds` and the verdict arithmetic need no torch, so
services without it (the orchestrator's image) can read the acceptance limits.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Each public name -> the submodule that defines it.
_WHERE = {
    "HEADER_BYTES": "codec",
    "ProofFormatError": "codec",
    "ProofContext": "context",
    "group_contexts": "context",
    "CHUNK_SIZE": "proof",
    "TOPK": "proof",
    "build_proof": "proof",
    "build_proofs_batch": "proof",
    "compare_hidden": "proof",
    "verify_proof": "proof",
    "verify_proofs_batch": "proof",
    "ChunkStats": "verdict",
    "Thresholds": "verdict",
    "VerifyResult": "verdict",
    "pooled_chunk_err": "verdict",
    "pooled_mant_err_mean": "verdict",
}
__all__ = [
    "HEADER_BYTES",
    "ProofFormatError",
    "ProofContext",
    "group_contexts",
    "CHUNK_SIZE",
    "TOPK",
    "build_proof",
    "build_proofs_batch",
    "compare_hidden",
    "verify_proof",
    "verify_proofs_batch",
    "ChunkStats",
    "Thresholds",
    "VerifyResult",
    "pooled_chunk_err",
    "pooled_mant_err_mean",
]

if TYPE_CHECKING:
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
    from .verdict import (
        ChunkStats,
        Thresholds,
        VerifyResult,
        pooled_chunk_err,
        pooled_mant_err_mean,
    )


def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value
