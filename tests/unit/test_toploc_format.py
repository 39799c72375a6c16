"""Malformed proofs are clean rejections with a reason: never an exception, never a hang."""

import random
import struct

import numpy as np
import pytest
import torch

from prime_swarm.libs.toploc import (
    HEADER_BYTES,
    ProofContext,
    build_proof,
    verify_proof,
    verify_proofs_batch,
)
from prime_swarm.libs.toploc.codec import ProofFormatError, decode

HIDDEN = torch.randn(40, 64, generator=torch.Generator().manual_seed(0))
CTX = ProofContext("m", "lease", 0, list(range(40)))
PROOF = build_proof(HIDDEN, CTX)
CHUNK1 = HEADER_BYTES + 258  # offset of the second chunk record


def rejected(proof: object, reason_part: str = "") -> str:
    result = verify_proof(HIDDEN, proof, CTX)  # type: ignore[arg-type]
    assert not result.ok
    assert result.reason and reason_part in result.reason, result.reason
    return result.reason


def with_u16(proof: bytes, offset: int, value: int) -> bytes:
    return proof[:offset] + struct.pack("<H", value) + proof[offset + 2 :]


def test_baseline_is_accepted() -> None:
    assert verify_proof(HIDDEN, PROOF, CTX).ok


def test_every_truncation_is_rejected() -> None:
    for n in range(len(PROOF)):
        rejected(PROOF[:n], "malformed")
    rejected(b"", "shorter than the header")


@pytest.mark.parametrize("extra", [b"\x00", b"\x00" * 258, PROOF[HEADER_BYTES:]])
def test_extended_proof_is_rejected(extra: bytes) -> None:
    rejected(PROOF + extra, "header implies")


@pytest.mark.parametrize(
    ("offset", "value", "why"),
    [
        (HEADER_BYTES, 0, "modulus 0"),
        (HEADER_BYTES, 65498, "modulus 65498"),
        (HEADER_BYTES, 127, "modulus 127"),
        (HEADER_BYTES, 65496, "must be 65497"),
        (CHUNK1, 0, "chunk 1: modulus 0"),
        (HEADER_BYTES + 2, 65497, "coefficient"),
        (CHUNK1 + 2 + 2 * 127, 0xFFFF, "chunk 1: coefficient"),
    ],
)
def test_bad_record_fields_are_rejected(offset: int, value: int, why: str) -> None:
    rejected(with_u16(PROOF, offset, value), why)


@pytest.mark.parametrize(
    ("offset", "patch", "why"),
    [
        (0, b"XX", "magic"),
        (2, b"\x02", "version"),
        (3, b"\x01", "reserved"),
        (4, struct.pack("<H", 0), "must be positive"),
        (4, struct.pack("<H", 16), "header implies"),
        (6, struct.pack("<H", 64), "header implies"),
        (8, struct.pack("<I", 41), "covers 41x64"),
        (8, struct.pack("<I", 0xFFFFFFFF), "exceeds"),
        (12, struct.pack("<I", 0), "hidden_size is 0"),
        (12, struct.pack("<I", 65), "covers 40x65"),
        (12, struct.pack("<I", 2), "header implies"),
    ],
)
def test_bad_header_fields_are_rejected(offset: int, patch: bytes, why: str) -> None:
    rejected(PROOF[:offset] + patch + PROOF[offset + len(patch) :], why)


def test_consistent_header_for_other_parameters_is_rejected() -> None:
    other = build_proof(HIDDEN[:20], CTX)
    rejected(other, "covers 20x64")
    rejected(build_proof(HIDDEN, CTX, chunk_size=16), "validator requires")


def test_non_bytes_inputs_are_rejected() -> None:
    for junk in (None, "proof", 42, [1, 2, 3], np.zeros(4)):
        rejected(junk, "must be bytes")
    assert verify_proof(HIDDEN, bytearray(PROOF), CTX).ok
    assert verify_proof(HIDDEN, memoryview(PROOF), CTX).ok


def test_random_bytes_of_the_right_length_are_rejected() -> None:
    rng = random.Random(1)
    rejected(rng.randbytes(len(PROOF)), "magic")
    # Even behind a valid header, a random body never verifies.
    for _ in range(20):
        rejected(PROOF[:HEADER_BYTES] + rng.randbytes(len(PROOF) - HEADER_BYTES))


def test_200_random_byte_strings_never_raise() -> None:
    rng = random.Random(2)
    for i in range(200):
        n = rng.choice([0, 1, 31, 32, 33, len(PROOF) - 1, len(PROOF), rng.randrange(2000)])
        junk = rng.randbytes(n)
        if i % 2:  # half of them start with a plausible header so the body parser is exercised
            junk = PROOF[: min(n, rng.choice([2, 4, 16, HEADER_BYTES]))] + junk
        rejected(junk)


def test_decode_raises_only_proof_format_errors() -> None:
    rng = random.Random(3)
    for _ in range(200):
        try:
            decode(PROOF[:HEADER_BYTES] + rng.randbytes(rng.randrange(600)))
        except ProofFormatError:
            pass


def test_single_bit_flips_never_raise_and_only_tiny_value_shifts_pass() -> None:
    # Flipping one of the low 4 bits of a constant coefficient shifts every decoded value by at
    # most 8 mantissa ulps, which the TOPLOC tolerance accepts by design; any other flip (header,
    # modulus, higher coefficients) must be rejected.
    tolerated = {HEADER_BYTES + 2, CHUNK1 + 2}
    flips, proofs = [], []
    for pos in range(len(PROOF)):
        # One bit per byte keeps this fast; every bit where a flip may legitimately pass.
        for bit in range(8) if pos in tolerated else [pos % 8]:
            flipped = bytearray(PROOF)
            flipped[pos] ^= 1 << bit
            flips.append((pos, bit))
            proofs.append(bytes(flipped))
    n = len(proofs)
    results = verify_proofs_batch([HIDDEN] * n, proofs, [CTX] * n)
    for (pos, bit), result in zip(flips, results, strict=True):
        if not (pos in tolerated and bit < 4):
            assert not result.ok, (pos, bit)
