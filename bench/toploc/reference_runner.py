"""Runs inside bench/.venv-toploc-ref (PyPI toploc==0.1.6 + torch==2.6.0), never in the project's
environment. Reads prover/validator activation pairs saved by `python -m bench.toploc`, builds and
verifies proofs with the reference package, and prints JSON.

    bench/.venv-toploc-ref/bin/python bench/toploc/reference_runner.py pairs.pt

Acceptance uses the published thresholds: exp_mismatches <= 38, mant_err_mean <= 10,
mant_err_median <= 8 for every chunk.
"""

from __future__ import annotations

import json
import sys
import time

import toploc
import torch


def accepted(results: list) -> bool:
    return all(
        r.exp_mismatches <= 38 and r.mant_err_mean <= 10 and r.mant_err_median <= 8 for r in results
    )


def modulus_zero(path: str) -> None:
    """The reference's weakness: verify a proof whose modulus is 0 (run in its own process, since
    it may take the process down)."""
    data = torch.load(path)
    forged = bytearray(toploc.build_proofs_bytes(data["prover"][0][:32], 32, 128, True)[0])
    forged[0:2] = b"\x00\x00"
    try:
        toploc.verify_proofs_bytes(data["validator"][0][:32], [bytes(forged)], 32, 128, True)
        print(json.dumps({"modulus_zero": "verified without error"}))
    except Exception as exc:
        print(json.dumps({"modulus_zero": f"raised {type(exc).__name__}: {exc}"[:200]}))


def main() -> None:
    if sys.argv[1] == "mod0":
        modulus_zero(sys.argv[2])
        return
    torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
    data = torch.load(sys.argv[1])
    build_s = verify_s = 0.0
    n_chunks = 0
    ok = 0
    crashed = 0
    for prover, validator in zip(data["prover"], data["validator"], strict=True):
        t0 = time.perf_counter()
        proofs = toploc.build_proofs_bytes(
            prover, decode_batching_size=32, topk=128, skip_prefill=True
        )
        build_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        try:
            res = toploc.verify_proofs_bytes(
                validator, proofs, decode_batching_size=32, topk=128, skip_prefill=True
            )
            ok += accepted(res)
        except Exception:
            crashed += 1
        verify_s += time.perf_counter() - t0
        n_chunks += len(proofs)
    print(
        json.dumps(
            {
                "torch": torch.__version__,
                "pairs": len(data["prover"]),
                "chunks": n_chunks,
                "build_s": build_s,
                "verify_s": verify_s,
                "accepted": ok,
                "verify_crashed": crashed,
            }
        )
    )


if __name__ == "__main__":
    main()
