"""Honest and dishonest provers against a tiny causal stand-in model."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from prime_swarm.libs.toploc import (
    HEADER_BYTES,
    ProofContext,
    Thresholds,
    batching,
    build_proof,
    build_proofs_batch,
    verify_proof,
    verify_proofs_batch,
)

VOCAB, HIDDEN, LAYERS, TOKENS = 500, 128, 6, 40


def make_model(seed: int, d: int = HIDDEN) -> tuple[torch.Tensor, list[tuple[torch.Tensor, ...]]]:
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(VOCAB, d, generator=g)
    layers = [
        (
            torch.randn(d, 4 * d, generator=g) / d**0.5,
            torch.randn(4 * d, d, generator=g) / (4 * d) ** 0.5,
        )
        for _ in range(LAYERS)
    ]
    return emb, layers


def run(model, ids: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Final hidden states; a causal running mean stands in for attention."""
    emb, layers = model
    h = emb[ids].to(dtype)
    positions = torch.arange(1, len(ids) + 1)[:, None]
    for w1, w2 in layers:
        x = F.layer_norm(h.float(), (h.shape[1],))
        x = (x + torch.cumsum(x, 0) / positions).to(dtype)
        h = h + F.gelu(x @ w1.to(dtype)) @ w2.to(dtype)
    return F.layer_norm(h.float(), (h.shape[1],)).to(dtype)


MODEL = make_model(0)
IDS = torch.randint(0, VOCAB, (TOKENS,), generator=torch.Generator().manual_seed(5))
CTX = ProofContext("sha256:model-v3", "lease-17", 2, IDS.tolist())
HONEST = run(MODEL, IDS)
PROOF = build_proof(HONEST, CTX)


def check(prover_hidden: torch.Tensor, validator_hidden: torch.Tensor = HONEST, ctx=CTX):
    return verify_proof(validator_hidden, build_proof(prover_hidden, ctx), ctx)


# --- honest ---------------------------------------------------------------------------------


def test_identical_recomputation_matches_exactly() -> None:
    result = verify_proof(HONEST, PROOF, CTX)
    assert result.ok, result.reason
    assert len(result.chunks) == 2  # 32 + a partial chunk of 8 tokens
    for st in result.chunks:
        assert (st.exp_mismatches, st.sign_mismatches, st.mant_err_mean) == (0, 0, 0.0)


def test_fp32_prover_input_is_rounded_to_bf16_like_the_validator() -> None:
    h = run(MODEL, IDS, torch.float32)
    assert build_proof(h, CTX) == build_proof(h.to(torch.bfloat16), CTX)


def test_one_ulp_noise_passes() -> None:
    g = torch.Generator().manual_seed(1)
    noisy = HONEST.float() * (1 + 2**-8 * torch.randn(HONEST.shape, generator=g))
    result = check(noisy)
    assert result.ok, result.reason
    assert max(st.mant_err_mean for st in result.chunks) < 2


def test_different_summation_order_passes() -> None:
    # The prover batches two completions through each matmul; the validator splits every matmul's
    # inner dimension in two and sums the halves. Both in fp32, so only summation order differs.
    emb, layers = MODEL
    ids2 = torch.randint(0, VOCAB, (TOKENS,), generator=torch.Generator().manual_seed(6))
    positions = torch.arange(1, TOKENS + 1)[:, None]
    h, v = emb[torch.stack([IDS, ids2])], emb[IDS]
    for w1, w2 in layers:
        x = F.layer_norm(h, (HIDDEN,))
        x = x + torch.cumsum(x, 1) / positions
        h = h + F.gelu(x @ w1) @ w2
        y = F.layer_norm(v, (HIDDEN,))
        y = y + torch.cumsum(y, 0) / positions
        a = F.gelu(y[:, :64] @ w1[:64] + y[:, 64:] @ w1[64:])
        v = v + a[:, 256:] @ w2[256:] + a[:, :256] @ w2[:256]
    prover, validator = F.layer_norm(h[0], (HIDDEN,)), F.layer_norm(v, (HIDDEN,))
    assert not torch.equal(prover, validator)
    result = verify_proof(validator, build_proof(prover, CTX), CTX)
    assert result.ok, result.reason


def test_ties_are_broken_the_same_way_on_both_sides() -> None:
    # Constant rows: every value ties, so only deterministic tie-breaking can pass.
    flat = torch.ones(TOKENS, HIDDEN)
    flat[::3] = -2.0
    assert check(flat, flat).ok
    zeros = torch.zeros(5, 8)
    assert check(zeros, zeros).ok


def test_nan_and_inf_do_not_break_the_prover() -> None:
    h = HONEST.float().clone()
    h[3, 7] = float("nan")
    h[4, 1] = -float("inf")
    assert check(h, h).ok


@pytest.mark.parametrize(
    ("tokens", "hidden", "points"),
    [(1, 64, [64]), (3, 2, [6]), (33, 4, [128, 4]), (64, 64, [128, 128]), (0, 64, [])],
)
def test_short_and_partial_chunks(tokens: int, hidden: int, points: list[int]) -> None:
    h = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(tokens))
    ctx = ProofContext("m", "l", 0, list(range(tokens)))
    proof = build_proof(h, ctx)
    assert len(proof) == HEADER_BYTES + sum(2 + 2 * k for k in points)
    result = verify_proof(h, proof, ctx)
    assert result.ok, result.reason
    assert [st.n_points for st in result.chunks] == points


def test_size_is_258_bytes_per_full_chunk() -> None:
    assert HEADER_BYTES == 32
    for n_chunks in (1, 2, 5):
        h = torch.randn(32 * n_chunks, 64)
        assert len(build_proof(h, CTX)) == HEADER_BYTES + 258 * n_chunks


def test_batch_matches_single_and_keeps_order(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(7)
    hiddens = [torch.randn(n, 64, generator=gen) for n in (40, 32, 5, 100)]
    ctxs = [ProofContext("m", f"lease-{i}", i, list(range(len(h)))) for i, h in enumerate(hiddens)]
    single = [build_proof(h, c) for h, c in zip(hiddens, ctxs, strict=True)]
    assert build_proofs_batch(hiddens, ctxs) == single
    # Tiny slabs force chunks of one completion across several slabs.
    monkeypatch.setattr(batching, "SLAB_ELEMENTS", 3 * 32 * 64)
    assert build_proofs_batch(hiddens, ctxs) == single
    proofs = list(single)
    proofs[1] = proofs[2]  # wrong proof for item 1
    results = verify_proofs_batch(hiddens, proofs, ctxs)
    assert [r.ok for r in results] == [True, False, True, True]


# --- dishonest ------------------------------------------------------------------------------


def test_other_weights_are_rejected() -> None:
    result = check(run(make_model(1), IDS))
    assert not result.ok
    assert "exponent mismatches" in result.reason


def test_truncated_model_is_rejected() -> None:
    emb, layers = MODEL
    assert not check(run((emb, layers[:-1]), IDS)).ok


def test_flipped_signs_are_rejected() -> None:
    result = check(-HONEST.float())
    assert not result.ok
    assert "sign mismatches" in result.reason
    assert result.chunks[0].sign_mismatches == 128


def test_flipping_only_the_committed_values_is_rejected() -> None:
    h = HONEST.float().clone()
    top = h[:32].abs().flatten().topk(128).indices
    h[:32].view(-1)[top[:20]] *= -1
    result = check(h)
    assert not result.ok and "chunk 0" in result.reason


@pytest.mark.parametrize(
    "other",
    [
        ProofContext(CTX.model_hash, CTX.lease_id, CTX.sample_index, [*CTX.token_ids[:-1], 1]),
        ProofContext(CTX.model_hash, "lease-18", CTX.sample_index, CTX.token_ids),
        ProofContext("sha256:model-v2", CTX.lease_id, CTX.sample_index, CTX.token_ids),
        ProofContext(CTX.model_hash, CTX.lease_id, 3, CTX.token_ids),
        # Length prefixes keep field boundaries unambiguous.
        ProofContext("sha256:model-v3l", "ease-17", CTX.sample_index, CTX.token_ids),
    ],
)
def test_proof_for_another_context_is_rejected(other: ProofContext) -> None:
    result = verify_proof(HONEST, PROOF, other)
    assert not result.ok
    assert "another context" in result.reason


def test_rewriting_only_the_header_digest_still_fails() -> None:
    other = ProofContext(CTX.model_hash, "lease-18", CTX.sample_index, CTX.token_ids)
    forged = PROOF[:16] + other.digest()[:16] + PROOF[32:]
    result = verify_proof(HONEST, forged, other)
    assert not result.ok
    assert result.chunks, "should fail on the numbers, after the header check passed"


def test_swapping_chunks_with_identical_hidden_states_fails() -> None:
    h = torch.cat([HONEST[:32], HONEST[:32]])
    proof = build_proof(h, CTX)
    a, b = proof[32 : 32 + 258], proof[32 + 258 :]
    assert a != b  # the chunk-keyed mask makes equal chunks commit differently
    assert not verify_proof(h, proof[:32] + b + a, CTX).ok


def test_validator_enforces_its_own_parameters() -> None:
    weak = build_proof(HONEST, CTX, topk=8)
    result = verify_proof(HONEST, weak, CTX)
    assert not result.ok and "validator requires" in result.reason
    assert verify_proof(HONEST, weak, CTX, topk=8).ok


def test_shape_mismatch_is_a_rejection() -> None:
    result = verify_proof(HONEST[:39], PROOF, CTX)
    assert not result.ok and "recomputed 39x128" in result.reason


# --- precision: what TOPLOC can and cannot see (measured, see the module report) ------------


def _worst(result) -> tuple[int, float]:
    return max(st.exp_mismatches for st in result.chunks), max(
        st.mant_err_mean for st in result.chunks
    )


def test_precision_changes_at_the_same_weights_are_within_honest_noise() -> None:
    # fp32 or fp16 compute, or fp16 storage of the final states, differs from bf16 compute by
    # about one bf16 ulp after 6 layers: indistinguishable from honest kernel noise, so accepted.
    for dtype in (torch.float32, torch.float16):
        result = check(run(MODEL, IDS, dtype))
        assert result.ok, (dtype, result.reason)
        exp_mis, mant_mean = _worst(result)
        assert exp_mis <= 5 and mant_mean < 2
    assert check(run(MODEL, IDS, torch.float32).half()).ok


def test_coarse_weight_quantization_is_rejected_but_int8_is_not() -> None:
    emb, layers = MODEL

    def quant(w: torch.Tensor, bits: int) -> torch.Tensor:
        scale = w.abs().amax(0, keepdim=True) / (2 ** (bits - 1) - 1)
        return (w / scale).round() * scale

    int8 = check(run((emb, [(quant(a, 8), quant(b, 8)) for a, b in layers]), IDS))
    int4 = check(run((emb, [(quant(a, 4), quant(b, 4)) for a, b in layers]), IDS))
    assert int8.ok
    assert not int4.ok


def test_thresholds_scale_with_points_and_validate() -> None:
    t = Thresholds()
    assert t.scaled(t.max_exp_mismatches, 128) == 38
    assert t.scaled(t.max_exp_mismatches, 64) == 19
    with pytest.raises(ValueError):
        Thresholds(max_exp_mismatches=-1)
    strict = Thresholds(max_mant_err_mean=0.0, max_mant_err_median=0.0)
    noisy = HONEST.float() * (1 + 2**-7 * torch.randn(HONEST.shape))
    assert not verify_proof(noisy, PROOF, CTX, strict).ok
    assert math.isinf(check(-HONEST.float()).chunks[0].mant_err_mean)
    assert np.isfinite(verify_proof(HONEST, PROOF, CTX).chunks[0].mant_err_median)


def test_invalid_submitted_context_is_a_rejection_for_the_validator() -> None:
    bad = ProofContext(CTX.model_hash, CTX.lease_id, CTX.sample_index, [-1, *CTX.token_ids[1:]])
    result = verify_proof(HONEST, PROOF, bad)
    assert not result.ok and "invalid context" in result.reason
    with pytest.raises(ValueError):
        build_proof(HONEST, bad)
