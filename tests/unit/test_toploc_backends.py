"""Generation backends: the torch backend's captured hidden states are what proofs are built on;
the vLLM backend is optional and skipped where vLLM is absent."""

from __future__ import annotations

import pytest
import torch

from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.rl.sampling import generate, generate_captured, prefill_at
from prime_swarm.libs.toploc import ProofContext, build_proof, exact_fraction, verify_proofs_batch
from prime_swarm.services.worker import vllm_backend


def _gen(precision: str) -> tuple:
    model = init_tiny_model(3).eval()
    prompts = [[1, 5, 6, 7], [1, 9, 10, 11, 12, 13]]
    groups = generate_captured(
        model,
        prompts,
        [11, 12],
        group_size=3,
        max_new_tokens=8,
        temperature=1.0,
        eos_id=2,
        precision=precision,
    )
    return model, prompts, groups


def test_captured_hidden_states_verify_against_a_prefill() -> None:
    model, prompts, groups = _gen("bf16")
    seqs = [(p, c.token_ids) for p, g in zip(prompts, groups, strict=True) for c in g]
    comps = [c for g in groups for c in g]
    pre = prefill_at(model, seqs)
    ctxs = [ProofContext("m", "l", i, c.token_ids) for i, c in enumerate(comps)]
    proofs = [build_proof(c.hidden, ctx) for c, ctx in zip(comps, ctxs, strict=True)]
    res = verify_proofs_batch([p.hidden for p in pre], proofs, ctxs)
    assert all(r.ok for r in res)
    assert exact_fraction(res) > 0.9
    for c in comps:
        assert c.hidden.dtype == torch.bfloat16 and c.hidden.shape[0] == len(c.token_ids)


def test_fp32_generation_loses_the_bf16_fingerprint() -> None:
    model, prompts, groups = _gen("fp32")
    comps = [c for g in groups for c in g]
    seqs = [(p, c.token_ids) for p, g in zip(prompts, groups, strict=True) for c in g]
    pre = prefill_at(model, seqs)
    ctxs = [ProofContext("m", "l", i, c.token_ids) for i, c in enumerate(comps)]
    proofs = [build_proof(c.hidden, ctx) for c, ctx in zip(comps, ctxs, strict=True)]
    res = verify_proofs_batch([p.hidden for p in pre], proofs, ctxs)
    assert exact_fraction(res) < 0.6


def test_fp32_captured_generation_keeps_the_seeded_choices() -> None:
    model = init_tiny_model(3).eval()
    old = generate(
        model, [1, 5, 6], group_size=2, max_new_tokens=6, temperature=1.0, seed=4, eos_id=2
    )
    new = generate_captured(
        model,
        [[1, 5, 6]],
        [4],
        group_size=2,
        max_new_tokens=6,
        temperature=1.0,
        eos_id=2,
        precision="fp32",
    )[0]
    assert [c.token_ids for c in old] == [c.token_ids for c in new]


def test_vllm_backend_is_optional() -> None:
    if vllm_backend.available():
        pytest.skip("vLLM installed: exercised by the GPU test below")
    with pytest.raises(RuntimeError, match="vllm"):
        vllm_backend.VLLMBackend("/nonexistent")


@pytest.mark.skipif(
    not vllm_backend.available() or not torch.cuda.is_available(), reason="needs vLLM and a GPU"
)
def test_vllm_backend_generates_with_captured_states(tmp_path) -> None:  # noqa: ANN001
    from prime_swarm.libs.model.build import build_tiny_model

    d = build_tiny_model(3, tmp_path / "m")
    backend = vllm_backend.VLLMBackend(str(d))
    (group,) = backend.generate(
        None, [[1, 5, 6]], [4], group_size=2, max_new_tokens=6, temperature=1.0, eos_id=2
    )
    assert all(c.hidden.shape[0] == len(c.token_ids) for c in group)
