"""The proof byte format and its strict parser.

Layout (all integers little-endian)::

    header, 32 bytes
      0   2  magic  b"TL"
      2   1  version (1)
      3   1  reserved, must be 0
      4   2  chunk_size   tokens per chunk (32)
      6   2  topk         points per full chunk (128)
      8   4  n_tokens     rows of hidden states committed
      12  4  hidden_size  columns of hidden states
      16 16  context      sha256(ProofContext encoding)[:16]
    then one record per chunk, in token order
      0   2  m            modulus applied to flat indices, k <= m <= 65497
      2  2k  coefficients of the masked polynomial, lowest degree first, each < 65497

with k = min(topk, tokens_in_chunk * hidden_size): exactly 2 + 2*128 = 258 bytes for a full
chunk at k = 128. Everything about the record sizes follows from the header, so the parser can
reject a malformed proof before any arithmetic, and never loops on attacker-chosen counts.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from .bits import ChunkLayout
from .gf import P

CHUNK_SIZE = 32
"""Tokens a proof chunk covers, unless a proof says otherwise in its header."""
TOPK = 128
"""Points committed per full chunk, likewise."""
MAGIC = b"TL"
VERSION = 1
HEADER = struct.Struct("<2sBBHHII16s")
HEADER_BYTES = HEADER.size
CONTEXT_BYTES = 16
MAX_TOKENS = 1 << 24
"""Refuse headers that claim more rows than any completion we serve, so a forged count cannot make
the parser allocate or compute without bound."""


class ProofFormatError(ValueError):
    """The proof bytes are malformed; the message says how."""


@dataclass(frozen=True)
class Header:
    chunk_size: int
    topk: int
    n_tokens: int
    hidden_size: int
    context: bytes

    def layout(self) -> ChunkLayout:
        return ChunkLayout(self.n_tokens, self.hidden_size, self.chunk_size, self.topk)


@dataclass(frozen=True)
class ChunkRun:
    """Consecutive chunks that share one k, so they can be handled as one array."""

    first_chunk: int
    moduli: np.ndarray  # [n] int64
    coeffs: np.ndarray  # [n, k] int64


def expected_size(layout: ChunkLayout) -> int:
    return HEADER_BYTES + layout.proof_body_bytes()


def encode(header: Header, runs: list[ChunkRun]) -> bytes:
    parts = [
        HEADER.pack(
            MAGIC,
            VERSION,
            0,
            header.chunk_size,
            header.topk,
            header.n_tokens,
            header.hidden_size,
            header.context,
        )
    ]
    for run in runs:
        records = np.concatenate([run.moduli[:, None], run.coeffs], axis=1)
        parts.append(records.astype("<u2").tobytes())
    return b"".join(parts)


def decode(proof: bytes) -> tuple[Header, list[ChunkRun]]:
    """Parse and sanity-check ``proof``; raises ProofFormatError, never anything else."""
    if not isinstance(proof, bytes | bytearray | memoryview):
        raise ProofFormatError(f"proof must be bytes, got {type(proof).__name__}")
    proof = bytes(proof)
    if len(proof) < HEADER_BYTES:
        raise ProofFormatError(f"proof is {len(proof)} bytes, shorter than the header")
    magic, version, reserved, chunk_size, topk, n_tokens, hidden_size, context = HEADER.unpack_from(
        proof
    )
    if magic != MAGIC:
        raise ProofFormatError(f"bad magic {magic!r}")
    if version != VERSION:
        raise ProofFormatError(f"unsupported proof version {version} (expected {VERSION})")
    if reserved != 0:
        raise ProofFormatError("reserved header byte is not zero")
    if chunk_size == 0 or topk == 0:
        raise ProofFormatError(f"chunk_size {chunk_size} and topk {topk} must be positive")
    if n_tokens > MAX_TOKENS:
        raise ProofFormatError(f"n_tokens {n_tokens} exceeds {MAX_TOKENS}")
    if n_tokens and hidden_size == 0:
        raise ProofFormatError("hidden_size is 0")
    header = Header(chunk_size, topk, n_tokens, hidden_size, context)
    layout = header.layout()
    want = expected_size(layout)
    if len(proof) != want:
        raise ProofFormatError(
            f"proof is {len(proof)} bytes, header implies {want} "
            f"({layout.n_chunks} chunks of {n_tokens} tokens x {hidden_size})"
        )
    body = np.frombuffer(proof, dtype="<u2", offset=HEADER_BYTES).astype(np.int64)
    runs: list[ChunkRun] = []
    offset = 0
    for first, count, k in layout.runs():
        records = body[offset : offset + count * (1 + k)].reshape(count, 1 + k)
        offset += count * (1 + k)
        moduli, coeffs = records[:, 0], records[:, 1:]
        bad = np.flatnonzero((moduli < k) | (moduli > P))
        if bad.size:
            i = int(bad[0])
            raise ProofFormatError(
                f"chunk {first + i}: modulus {int(moduli[i])} outside [{k}, {P}]"
            )
        # A chunk with at most P values has all indices below P, so the prover's search stops at
        # P: any other modulus is a non-canonical (malleated) encoding of the same proof.
        if layout.chunk_tokens(first) * hidden_size <= P and (moduli != P).any():
            i = int(np.flatnonzero(moduli != P)[0])
            raise ProofFormatError(
                f"chunk {first + i}: modulus {int(moduli[i])}, must be {P} for a chunk this small"
            )
        bad = np.flatnonzero((coeffs >= P).any(axis=1))
        if bad.size:
            raise ProofFormatError(f"chunk {first + int(bad[0])}: coefficient >= {P}")
        runs.append(ChunkRun(first, moduli, coeffs))
    return header, runs
