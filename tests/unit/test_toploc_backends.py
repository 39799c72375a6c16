"""TOPLOC proofs over the worker's proof prefill of what the `hf` backend generated: they verify
against the validator's own prefill within the second opinion's limits, whatever precision the
worker computed in, and nothing else verifies."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.hf_backend import HFBackend
from prime_swarm.libs.model.tokenizer import build_tokenizer, prompt_ids
from prime_swarm.libs.rollout.calibration import Acceptance, acceptance_for
from prime_swarm.libs.rollout.recompute import prefill_hidden
from prime_swarm.libs.rollout.verify import replay_gaps
from prime_swarm.libs.toploc import (
    ProofContext,
    build_proof,
    build_proofs_batch,
    group_contexts,
    pooled_mant_err_mean,
    verify_proof,
    verify_proofs_batch,
)

MODEL_HASH, LEASE = "ab" * 32, "lease-7"
TEXTS = ["rev 4821=", "rev 90817="]
SEEDS = [11, 12]
GROUP = 3
MAX_NEW = 16  # half a proof chunk (32 tokens): the partial-chunk path real completions take


pytestmark = pytest.mark.usefixtures("inference")


@pytest.fixture(scope="module")
def acceptance() -> Acceptance:
    acc = acceptance_for("hf")
    assert acc is not None
    return acc


@pytest.fixture(scope="module")
def lm() -> CausalLM:
    return CausalLM(init_tiny_model(3), build_tokenizer())


@pytest.fixture(scope="module")
def prompts(lm: CausalLM) -> list[list[int]]:
    return [prompt_ids(lm.tokenizer, t) for t in TEXTS]


@dataclass
class Proved:
    """A generation with the hidden states its proof commits to: the worker's proof prefill in
    the precision it generated in (libs/rollout/answer.py)."""

    token_ids: list[int]
    hidden: torch.Tensor


@pytest.fixture(scope="module")
def generated(lm: CausalLM, prompts: list[list[int]]) -> dict[str, list[list[Proved]]]:
    """One batch of groups per worker precision (all computed once for the module)."""
    out = {}
    for precision in ("bf16", "fp16", "fp32"):
        groups = HFBackend(precision).generate(
            lm, prompts, SEEDS, group_size=GROUP, max_new_tokens=MAX_NEW, temperature=1.0
        )
        out[precision] = []
        for p, g in zip(prompts, groups, strict=True):
            hiddens = prefill_hidden(lm, [(p, c.token_ids) for c in g], precision)
            out[precision].append([Proved(c.token_ids, h) for c, h in zip(g, hiddens, strict=True)])
    return out


def _flat(
    prompts: list[list[int]], groups: list[list[Proved]]
) -> tuple[list[tuple[list[int], list[int]]], list[Proved]]:
    seqs = [(p, c.token_ids) for p, g in zip(prompts, groups, strict=True) for c in g]
    return seqs, [c for g in groups for c in g]


def _prove(comps: list[Proved]) -> tuple[list[bytes], list[ProofContext]]:
    # Contexts per group, sample index within the group, as worker and validator build them.
    ctxs = [
        ctx
        for i in range(0, len(comps), GROUP)
        for ctx in group_contexts(
            MODEL_HASH, f"{LEASE}/{i}", [c.token_ids for c in comps[i : i + GROUP]]
        )
    ]
    return build_proofs_batch([c.hidden for c in comps], ctxs), ctxs


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_captured_hidden_states_verify_against_the_reference_prefill(
    lm: CausalLM,
    prompts: list[list[int]],
    generated: dict[str, list[list[Proved]]],
    acceptance: Acceptance,
    precision: str,
) -> None:
    # A worker computing in fp16 or fp32 does more work, not less: it must be accepted.
    seqs, comps = _flat(prompts, generated[precision])
    for c in comps:
        assert c.hidden.dtype == torch.bfloat16
        assert c.hidden.shape == (len(c.token_ids), lm.hidden_size)
    assert any(len(c.token_ids) > 1 for c in comps)
    proofs, ctxs = _prove(comps)
    # The validator recomputes in the precision the worker declares.
    mine = prefill_hidden(lm, seqs, precision)
    results = verify_proofs_batch(mine, proofs, ctxs, acceptance.gross)
    assert pooled_mant_err_mean(results) <= acceptance.recheck.max_group_mant_err
    assert all(r.ok for r in results), [r.reason for r in results if not r.ok]
    assert all(r.chunks for r in results)  # numbers were compared, not just headers
    # The sampled tokens replay against the same recomputation.
    for n, (c, hidden) in enumerate(zip(comps, mine, strict=True)):
        gaps = replay_gaps(lm.head_logits(hidden), c.token_ids, 1.0, SEEDS[n // GROUP], n % GROUP)
        assert float(gaps.max()) <= acceptance.recheck.max_replay_gap


def test_batched_proofs_equal_single_proofs(generated: dict[str, list[list[Proved]]]) -> None:
    comps = [c for g in generated["bf16"] for c in g]
    proofs, ctxs = _prove(comps)
    assert proofs == [build_proof(c.hidden, ctx) for c, ctx in zip(comps, ctxs, strict=True)]


def test_other_weights_fail(
    prompts: list[list[int]],
    generated: dict[str, list[list[Proved]]],
    acceptance: Acceptance,
) -> None:
    seqs, comps = _flat(prompts, generated["bf16"])
    proofs, ctxs = _prove(comps)
    other = CausalLM(init_tiny_model(4), build_tokenizer())
    results = verify_proofs_batch(
        prefill_hidden(other, seqs, "bf16"),
        proofs,
        ctxs,
        acceptance.gross,
    )
    assert not any(r.ok for r in results)
    assert all("mismatches" in (r.reason or "") for r in results)


def test_a_proof_is_bound_to_its_context(
    lm: CausalLM,
    prompts: list[list[int]],
    generated: dict[str, list[list[Proved]]],
    acceptance: Acceptance,
) -> None:
    seqs, comps = _flat(prompts, generated["bf16"])
    proofs, ctxs = _prove(comps)
    mine = prefill_hidden(lm, seqs, "bf16")
    ctx, proof, hidden = ctxs[0], proofs[0], mine[0]
    assert verify_proof(hidden, proof, ctx, acceptance.gross).ok
    for other in (
        ProofContext("cd" * 32, ctx.lease_id, ctx.sample_index, ctx.token_ids),
        ProofContext(ctx.model_hash, "another-lease", ctx.sample_index, ctx.token_ids),
        ProofContext(ctx.model_hash, ctx.lease_id, 1, ctx.token_ids),
        ProofContext(ctx.model_hash, ctx.lease_id, 0, [*ctx.token_ids[:-1], ctx.token_ids[-1] ^ 1]),
    ):
        res = verify_proof(hidden, proof, other, acceptance.gross)
        assert not res.ok and "another context" in (res.reason or "")
    # Another completion's proof (same group, same length) does not verify this one.
    same_len = next(
        i for i in range(1, len(comps)) if len(comps[i].token_ids) == len(comps[0].token_ids)
    )
    assert not verify_proof(hidden, proofs[same_len], ctx, acceptance.gross).ok


def test_malformed_proofs_are_rejected_not_raised(
    lm: CausalLM,
    prompts: list[list[int]],
    generated: dict[str, list[list[Proved]]],
    acceptance: Acceptance,
) -> None:
    seqs, comps = _flat(prompts, generated["bf16"])
    proofs, ctxs = _prove(comps)
    (hidden,) = prefill_hidden(lm, seqs[:1], "bf16")
    for bad in (b"", b"garbage", proofs[0][:-1], proofs[0] + b"\x00", "not bytes"):
        res = verify_proof(hidden, bad, ctxs[0], acceptance.gross)  # type: ignore[arg-type]
        assert not res.ok and res.reason
