"""The proof prefill and the fp32 reference share each prompt's forward across its group; both
must still be the per-sequence computation (up to rounding), and the proof prefill must not
depend on what else was in the call."""

import pytest
import torch

from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.forward import completion_hidden
from prime_swarm.libs.model.tokenizer import build_tokenizer
from prime_swarm.libs.rollout import recompute as rc

pytestmark = pytest.mark.usefixtures("inference")


@pytest.fixture(scope="module")
def lm() -> CausalLM:
    return CausalLM(init_tiny_model(1), build_tokenizer())


def groups(lm: CausalLM) -> list[tuple[list[int], list[int]]]:
    """Two prompts of different lengths, four completions each of lengths 1 to 19, interleaved."""
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, lm.vocab_size, (n,), generator=gen).tolist() for n in (7, 12)]
    lengths = [1 + 6 * (k // 2) for k in range(8)]
    return [
        (prompts[k % 2], torch.randint(3, lm.vocab_size, (n,), generator=gen).tolist())
        for k, n in enumerate(lengths)
    ]


def alone_unshared(lm: CausalLM, pair: tuple[list[int], list[int]], precision: str) -> torch.Tensor:
    hidden, _, _ = completion_hidden(lm.cast(precision), [pair])
    return hidden[0, : len(pair[1])].float()


def test_the_proof_prefill_is_the_sequence_forward_and_ignores_its_company(lm: CausalLM) -> None:
    pairs = groups(lm)
    together = rc.prefill_hidden(lm, pairs, "bf16")
    reversed_ = rc.prefill_hidden(lm, pairs[::-1], "bf16")[::-1]
    for pair, mine, back in zip(pairs, together, reversed_, strict=True):
        assert mine.dtype == torch.bfloat16 and mine.shape[0] == len(pair[1])
        # Bit for bit whatever the call held: alone, in another order, in another group.
        assert torch.equal(rc.prefill_hidden(lm, [pair], "bf16")[0], mine)
        assert torch.equal(back, mine)
        # The prompt's cached keys give the full sequence's forward up to bf16 rounding.
        full = alone_unshared(lm, pair, "bf16")
        scale = full.abs().max()
        assert float((mine.float() - full).abs().max()) <= 0.05 * float(scale)


def test_the_fp32_reference_matches_the_unshared_forward_across_chunks(
    lm: CausalLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    pairs = groups(lm)
    # Chunks of a few pairs each: a group's prompt is forwarded again in every chunk it spans.
    monkeypatch.setattr(rc, "REFERENCE_CHUNK_TOKENS", 40)
    reference = rc._reference_hidden(lm, pairs)
    assert len(reference) == len(pairs)
    for pair, ref in zip(pairs, reference, strict=True):
        assert ref.dtype == torch.float32 and ref.shape[0] == len(pair[1])
        torch.testing.assert_close(ref, alone_unshared(lm, pair, "fp32"), rtol=1e-4, atol=1e-4)


def test_recompute_pairs_the_reference_with_the_proof_prefill(lm: CausalLM) -> None:
    pairs = groups(lm)
    recs = rc.recompute(lm, pairs, "bf16")
    for pair, rec, proof in zip(pairs, recs, rc.prefill_hidden(lm, pairs, "bf16"), strict=True):
        # The declared recomputation is what an honest worker of this class proved over.
        assert torch.equal(rec.declared, proof)
        assert rec.reference.shape == rec.declared.shape == (len(pair[1]), lm.config.hidden_size)
