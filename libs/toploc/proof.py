"""Build and verify TOPLOC proofs over final hidden states.

The prover commits, per chunk of ``chunk_size`` tokens, to the ``topk`` largest-magnitude bf16
values of the chunk's hidden states as a polynomial over GF(65497) through (flat index mod m,
masked bit pattern). The validator recomputes the hidden states, picks its own top-k, evaluates
the polynomial there and compares sign, exponent and mantissa bits.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from . import gf
from .batching import Run, Slab, runs_for, slabs
from .bits import ChunkLayout, canonical, select_topk
from .codec import CHUNK_SIZE, TOPK, ChunkRun, Header, ProofFormatError, decode, encode
from .context import DIGEST_BYTES, ProofContext, chunk_keys, key_base, value_mask
from .verdict import ChunkStats, Thresholds, VerifyResult, compare_rows

_MODULUS_BLOCK = 64


def _as_bf16(hidden: torch.Tensor) -> torch.Tensor:
    if hidden.ndim != 2:
        raise ValueError(f"hidden states must be [tokens, hidden], got shape {tuple(hidden.shape)}")
    if not (hidden.dtype.is_floating_point):
        raise ValueError(f"hidden states must be floating point, got {hidden.dtype}")
    # Round on the source device (halves any GPU->CPU copy), then work on CPU.
    return hidden.detach().to(torch.bfloat16).cpu().contiguous()


def _check_params(chunk_size: int, topk: int) -> None:
    if not 0 < chunk_size < 1 << 16 or not 0 < topk < gf.P:
        raise ValueError(f"chunk_size {chunk_size} / topk {topk} out of range")


def find_moduli(idx: np.ndarray) -> np.ndarray:
    """Largest m <= P per row such that the row's indices stay distinct mod m.

    Almost every row succeeds at m = P (always when the chunk has <= P elements), so all rows are
    tried there at once; the rare collisions search downward in vectorized blocks.
    """
    k = idx.shape[1]
    moduli = np.full(idx.shape[0], gf.P, dtype=np.int64)
    s = np.sort(idx % gf.P, axis=1)
    for row in np.flatnonzero((s[:, 1:] == s[:, :-1]).any(axis=1)):
        moduli[row] = _search_modulus(idx[row], k)
    return moduli


def _search_modulus(idx: np.ndarray, k: int) -> int:
    top = gf.P - 1
    while top >= k:
        cands = np.arange(top, max(k, top - _MODULUS_BLOCK + 1) - 1, -1, dtype=np.int64)
        s = np.sort(idx[None, :] % cands[:, None], axis=1)
        distinct = ~(s[:, 1:] == s[:, :-1]).any(axis=1)
        if distinct.any():
            return int(cands[int(np.argmax(distinct))])
        top = int(cands[-1]) - 1
    raise RuntimeError("no modulus keeps the top-k indices distinct")  # never seen in practice


def build_proofs_batch(
    hiddens: Sequence[torch.Tensor],
    contexts: Sequence[ProofContext],
    chunk_size: int = CHUNK_SIZE,
    topk: int = TOPK,
) -> list[bytes]:
    """One proof per completion; chunks of all completions are processed together."""
    if len(hiddens) != len(contexts):
        raise ValueError(f"{len(hiddens)} hidden tensors for {len(contexts)} contexts")
    _check_params(chunk_size, topk)
    headers: list[Header] = []
    bases: list[int] = []
    runs: list[Run] = []
    records: list[list[ChunkRun]] = []
    for item, (hidden, ctx) in enumerate(zip(hiddens, contexts, strict=True)):
        h = _as_bf16(hidden)
        digest = ctx.digest()
        headers.append(Header(chunk_size, topk, h.shape[0], h.shape[1], digest[:DIGEST_BYTES]))
        bases.append(key_base(digest))
        records.append([])
        for run in runs_for(item, h, headers[-1].layout()):
            count = run.rows.shape[0]
            # Each row remembers where its record lives, so results scatter back per run.
            run.extras = {
                "run": np.full(count, len(runs), dtype=np.int64),
                "row": np.arange(count, dtype=np.int64),
            }
            rec = ChunkRun(
                run.first_chunk, np.zeros(count, np.int64), np.zeros((count, run.k), np.int64)
            )
            runs.append(run)
            records[-1].append(rec)
    flat_records = [rec for item_records in records for rec in item_records]
    base_arr = np.array(bases, dtype=np.uint64)

    # Top-k selection needs rows of one length (a slab); the field arithmetic only needs one k,
    # so it runs once over every slab that shares it: its cost is mostly per call (k vector
    # steps), and completions of many lengths would otherwise pay it once per length.
    picked = []
    for slab in slabs(runs):
        idx, ys = select_topk(slab.rows, slab.k)
        moduli = find_moduli(idx)
        xs = idx % moduli[:, None]
        keys = chunk_keys(base_arr[slab.items], slab.chunks)
        picked.append((slab, moduli, xs, (ys + value_mask(keys, xs)) % gf.P))
    for same_k in _by_k(picked):
        coeffs_all = gf.interpolate(
            np.concatenate([xs for _, _, xs, _ in same_k]),
            np.concatenate([ys for _, _, _, ys in same_k]),
        )
        at = 0
        for slab, moduli, xs, _ in same_k:
            coeffs, at = coeffs_all[at : at + len(xs)], at + len(xs)
            _scatter(slab, moduli, coeffs, flat_records)

    return [encode(header, recs) for header, recs in zip(headers, records, strict=True)]


def _by_k(picked: list[tuple]) -> list[list[tuple]]:
    """(slab, ...) entries grouped by the slab's k."""
    groups: dict[int, list[tuple]] = {}
    for entry in picked:
        groups.setdefault(entry[0].k, []).append(entry)
    return list(groups.values())


def _scatter(
    slab: Slab, moduli: np.ndarray, coeffs: np.ndarray, flat_records: list[ChunkRun]
) -> None:
    """A slab's moduli and coefficients into the records of the runs its rows came from."""
    extras = slab.extras
    for run_id in np.unique(extras["run"]):
        sel = extras["run"] == run_id
        rec = flat_records[int(run_id)]
        rec.moduli[extras["row"][sel]] = moduli[sel]
        rec.coeffs[extras["row"][sel]] = coeffs[sel]


def build_proof(
    hidden: torch.Tensor,
    context: ProofContext,
    chunk_size: int = CHUNK_SIZE,
    topk: int = TOPK,
) -> bytes:
    """Proof for one completion's final hidden states ``[tokens, hidden]`` (fp32 or bf16)."""
    return build_proofs_batch([hidden], [context], chunk_size, topk)[0]


def _parse_for(
    proof: object, hidden: torch.Tensor, digest: bytes, chunk_size: int, topk: int
) -> tuple[Header, list[ChunkRun]] | str:
    """Decoded proof, or the reason it cannot be checked against this context and tensor."""
    try:
        header, chunk_runs = decode(proof)  # type: ignore[arg-type]
    except ProofFormatError as exc:
        return f"malformed proof: {exc}"
    if (header.chunk_size, header.topk) != (chunk_size, topk):
        return (
            f"proof parameters chunk_size={header.chunk_size} topk={header.topk}, "
            f"validator requires {chunk_size}/{topk}"
        )
    if (header.n_tokens, header.hidden_size) != tuple(hidden.shape):
        return (
            f"proof covers {header.n_tokens}x{header.hidden_size} hidden states, "
            f"recomputed {hidden.shape[0]}x{hidden.shape[1]}"
        )
    if header.context != digest[:DIGEST_BYTES]:
        return "proof was made for another context (model hash, lease, sample or tokens)"
    return header, chunk_runs


def verify_proofs_batch(
    hiddens: Sequence[torch.Tensor],
    proofs: Sequence[object],
    contexts: Sequence[ProofContext],
    thresholds: Thresholds | None = None,
    chunk_size: int = CHUNK_SIZE,
    topk: int = TOPK,
) -> list[VerifyResult]:
    """Check each proof against recomputed hidden states. Never raises on bad proof bytes: a bad
    proof yields ``ok=False`` with a reason. Raises ValueError only for the caller's own inputs
    (mismatched list lengths, non-2-D hidden states)."""
    if not len(hiddens) == len(proofs) == len(contexts):
        raise ValueError("hiddens, proofs and contexts must have the same length")
    _check_params(chunk_size, topk)
    thresholds = thresholds or Thresholds()
    results: list[VerifyResult | None] = [None] * len(hiddens)
    stats: dict[int, list[ChunkStats | None]] = {}
    bases = np.zeros(len(hiddens), dtype=np.uint64)
    runs: list[Run] = []
    for item, (hidden, proof, ctx) in enumerate(zip(hiddens, proofs, contexts, strict=True)):
        h = _as_bf16(hidden)
        try:
            digest = ctx.digest()
        except ValueError as exc:  # the context comes from a submission: reject, don't crash
            results[item] = VerifyResult.reject(f"invalid context: {exc}")
            continue
        parsed = _parse_for(proof, h, digest, chunk_size, topk)
        if isinstance(parsed, str):
            results[item] = VerifyResult.reject(parsed)
            continue
        _, chunk_runs = parsed
        bases[item] = key_base(digest)
        layout = ChunkLayout(h.shape[0], h.shape[1], chunk_size, topk)
        stats[item] = [None] * layout.n_chunks
        for run, rec in zip(runs_for(item, h, layout), chunk_runs, strict=True):
            run.extras = {"moduli": rec.moduli, "coeffs": rec.coeffs}
            runs.append(run)

    picked = []
    for slab in slabs(runs):
        idx, mine = select_topk(slab.rows, slab.k)
        xs = idx % slab.extras["moduli"][:, None]
        picked.append((slab, mine, xs, chunk_keys(bases[slab.items], slab.chunks)))
    for same_k in _by_k(picked):  # one evaluation per k, as in build_proofs_batch
        values = gf.evaluate(
            np.concatenate([slab.extras["coeffs"] for slab, _, _, _ in same_k]),
            np.concatenate([xs for _, _, xs, _ in same_k]),
        )
        at = 0
        for slab, mine, xs, keys in same_k:
            theirs = (values[at : at + len(xs)] - value_mask(keys, xs)) % gf.P
            at += len(xs)
            chunk_stats = compare_rows(mine, theirs)
            for item, chunk, st in zip(slab.items, slab.chunks, chunk_stats, strict=True):
                stats[int(item)][int(chunk)] = st

    for item, chunk_stats in stats.items():
        done = [st for st in chunk_stats if st is not None]
        reason = None
        for i, st in enumerate(done):
            why = st.failure(thresholds)
            if why is not None:
                reason = f"chunk {i}: {why}"
                break
        results[item] = VerifyResult(ok=reason is None, reason=reason, chunks=done)
    return [r for r in results if r is not None]


def verify_proof(
    hidden: torch.Tensor,
    proof: bytes,
    context: ProofContext,
    thresholds: Thresholds | None = None,
    chunk_size: int = CHUNK_SIZE,
    topk: int = TOPK,
) -> VerifyResult:
    """Check one proof against the validator's recomputed hidden states ``[tokens, hidden]``."""
    return verify_proofs_batch([hidden], [proof], [context], thresholds, chunk_size, topk)[0]


def compare_hidden(
    reference: torch.Tensor,
    other: torch.Tensor,
    chunk_size: int = CHUNK_SIZE,
    topk: int = TOPK,
) -> list[ChunkStats]:
    """Chunk statistics of `other` against `reference` ([tokens, hidden] each) at the points a
    proof of `reference` would commit to: the same numbers `verify_proof` reports for a proof of
    `other`, without building one. The validator measures its own honest noise with it."""
    ref, oth = _as_bf16(reference), _as_bf16(other)
    if ref.shape != oth.shape:
        raise ValueError(f"shapes differ: {tuple(ref.shape)} and {tuple(oth.shape)}")
    _check_params(chunk_size, topk)
    layout = ChunkLayout(ref.shape[0], ref.shape[1], chunk_size, topk)
    out: list[ChunkStats] = []
    for run, other_run in zip(runs_for(0, ref, layout), runs_for(0, oth, layout), strict=True):
        idx, mine = select_topk(run.rows, run.k)
        theirs = torch.gather(other_run.rows.view(torch.int16), 1, torch.from_numpy(idx))
        out.extend(compare_rows(mine, canonical(theirs.numpy().astype(np.int64) & 0xFFFF)))
    return out
