"""Sequence packing: several (prompt, completion) sequences share a row, kept apart by restarted
position ids (transformers builds the block-diagonal causal mask from them). Packed outputs must
be the padded outputs, up to float reordering, so a packed step is the padded step."""

from __future__ import annotations

import pytest
import torch

from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.logprobs import token_logprobs
from prime_swarm.libs.model.tokenizer import build_tokenizer
from prime_swarm.libs.rl.forward import (
    forward_completions,
    forward_completions_packed,
    pack_rows,
)
from prime_swarm.libs.rl.grpo import (
    GRPOConfig,
    Item,
    Rollout,
    grpo_step,
    packed_micro_batches,
)

BOS, EOS = 257, 258


def _lm(attn: str = "sdpa") -> CausalLM:
    module = init_tiny_model(0)
    module.set_attn_implementation(attn)
    return CausalLM(module, build_tokenizer())


def _pairs(n: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """Prompts of 1-12 tokens, completions of 1-20 (lengths vary: packing has gaps to fill)."""
    g = torch.Generator().manual_seed(seed)

    def ids(k: int) -> list[int]:
        return torch.randint(0, 256, (k,), generator=g).tolist()

    out = []
    for _ in range(n):
        p, c = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((0, 12), (0, 19)))
        out.append(([BOS, *ids(p)], [*ids(c), EOS]))
    return out


def test_pack_rows_is_first_fit_decreasing() -> None:
    lengths = [5, 9, 3, 7, 2, 9, 1]
    rows = pack_rows(lengths, 10)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 10 for row in rows)
    # 9+1, 9, 7+3, 5+2: the two 9s open rows first, the 1 fills the first gap it fits.
    assert rows == [[1, 6], [5], [3, 2], [0, 4]]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("row_tokens", [None, 64, 1000])
def test_packed_forward_equals_the_padded_one(attn: str, row_tokens: int | None) -> None:
    lm = _lm(attn)
    pairs = [*_pairs(9), ([BOS], [EOS])]  # a one-token prompt and completion too
    with torch.no_grad():
        padded = forward_completions(lm, pairs)
        packed = forward_completions_packed(lm, pairs, row_tokens)
    logits, hidden, targets, mask = padded
    p_logits, p_hidden, p_targets, p_mask = packed
    assert p_logits.shape == logits.shape and p_hidden.shape == hidden.shape
    assert torch.equal(p_targets, targets) and torch.equal(p_mask, mask)
    # Outside the mask both hold arbitrary (finite) rows; inside they are the same positions.
    assert torch.allclose(p_logits[mask], logits[mask], atol=1e-5)
    assert torch.allclose(p_hidden[mask], hidden[mask], atol=1e-5)
    lp, p_lp = (token_logprobs(x, targets, 1.0)[mask] for x in (logits, p_logits))
    assert torch.allclose(p_lp, lp, atol=1e-5)


def test_a_packed_row_holds_several_sequences() -> None:
    """The equivalence above is not vacuous: the rows really are shared."""
    pairs = _pairs(9)
    lengths = [len(p) + len(c) for p, c in pairs]
    assert len(pack_rows(lengths, max(lengths))) < len(pairs)


def _item(prompt: int, completion: int) -> Item:
    r = Rollout([BOS] * prompt, [EOS] * completion, [0.0] * completion, 1.0)
    return Item(r, 1.0)


def test_packed_micro_batches_fit_the_budget() -> None:
    items = [_item(p, c) for p, c in [(3, 9), (1, 1), (5, 2), (2, 14), (7, 7), (1, 3), (4, 4)]]
    for budget in (1, 16, 20, 40, 1000):
        mbs = packed_micro_batches(items, budget)
        assert sorted(map(id, (i for mb in mbs for i in mb))) == sorted(map(id, items))
        for mb in mbs:
            lengths = [len(i.rollout.prompt_ids) + len(i.rollout.completion_ids) for i in mb]
            padded = len(pack_rows(lengths, max(lengths))) * max(lengths)
            # A sequence longer than the budget still gets a micro-batch of its own.
            assert padded <= budget or len(mb) == 1
    assert len(packed_micro_batches(items, 1000)) == 1


def _groups(lm: CausalLM) -> list[list[Rollout]]:
    pairs = _pairs(7, seed=1)
    with torch.no_grad():
        logits, _, targets, mask = forward_completions(lm, pairs)
        old = token_logprobs(logits, targets, 1.0)
    rollouts = [
        # Off-policy by a little, so ratios differ from 1 and clipping is exercised.
        Rollout(p, c, (old[i][mask[i]] - 0.1 * (i % 3)).tolist(), float(i % 3), 1.0)
        for i, (p, c) in enumerate(pairs)
    ]
    return [rollouts[:3], rollouts[3:]]


@pytest.mark.parametrize("budget", [10_000, 40])
def test_a_packed_step_has_the_padded_steps_gradients(budget: int) -> None:
    results = []
    for packing in (False, True):
        lm = _lm()
        opt = torch.optim.SGD(lm.module.parameters(), lr=0.0)
        cfg = GRPOConfig(micro_batch_tokens=budget, packing=packing)
        stats = grpo_step(lm, opt, _groups(lm), cfg)
        results.append(([p.grad.clone() for p in lm.module.parameters()], stats))
    (g1, s1), (g2, s2) = results
    assert s1["tokens"] == s2["tokens"] and s1["clip_frac"] == s2["clip_frac"]
    assert s1["loss"] == pytest.approx(s2["loss"], abs=1e-6)
    assert s1["grad_norm"] == pytest.approx(s2["grad_norm"], rel=1e-5)
    for a, b in zip(g1, g2, strict=True):
        assert torch.allclose(a, b, atol=1e-6)
