"""Layouts of the training forward. Packing: several (prompt, completion) sequences share a row,
kept apart by restarted position ids (transformers builds the block-diagonal causal mask from
them). Shared prompts: each distinct prompt runs once, its completions reach it through the KV
cache. Every layout's outputs and gradients must be the padded ones, up to float reordering, so
every layout's step is the padded step."""

from __future__ import annotations

import pytest
import torch

from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.forward import (
    distinct_prompts,
    forward_completions,
    forward_completions_packed,
    forward_completions_shared,
    pack_rows,
)
from prime_swarm.libs.model.logprobs import token_logprobs
from prime_swarm.libs.model.tokenizer import build_tokenizer
from prime_swarm.libs.rl.grpo import (
    GRPOConfig,
    Item,
    Rollout,
    packed_micro_batches,
    shared_prompt_micro_batches,
)
from prime_swarm.libs.rl.step import train_step

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


def _grouped_pairs(seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """Groups of completions of one prompt, as GRPO makes them: three prompts (two of one
    length), 1-5 completions each (one empty), shuffled."""
    g = torch.Generator().manual_seed(seed)
    prompts = [[BOS, 5, 6, 7], [BOS, 9, 9, 1], [BOS, 3]]
    pairs = []
    for k, prompt in enumerate(prompts):
        for _ in range(k + 2):
            n = int(torch.randint(1, 19, (1,), generator=g))
            pairs.append((prompt, [*torch.randint(0, 256, (n,), generator=g).tolist(), EOS]))
    pairs.append((prompts[0], []))
    return [pairs[i] for i in torch.randperm(len(pairs), generator=g).tolist()]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_the_shared_prompt_forward_equals_the_padded_one(attn: str) -> None:
    lm = _lm(attn)
    pairs = _grouped_pairs()
    prompts, owner = distinct_prompts(pairs)
    assert sorted(map(len, prompts)) == [2, 4, 4] and len(owner) == len(pairs)
    outputs = []
    for forward in (forward_completions, forward_completions_shared):
        lm.module.zero_grad()
        logits, hidden, targets, mask = forward(lm, pairs)
        lp = token_logprobs(logits, targets, 1.0)
        (lp * mask).sum().backward()
        grads = [p.grad.clone() for p in lm.module.parameters()]
        outputs.append((logits, hidden, targets, mask, lp, grads))
    (logits, hidden, targets, mask, lp, grads), shared = outputs
    assert shared[0].shape == logits.shape and shared[1].shape == hidden.shape
    assert torch.equal(shared[2], targets) and torch.equal(shared[3], mask)
    assert torch.allclose(shared[1][mask], hidden[mask], atol=1e-5)
    assert torch.allclose(shared[4][mask], lp[mask], atol=1e-5)
    # The gradient reaches the prompt's positions through the cache: the same as running the
    # prompt once per completion.
    for a, b in zip(grads, shared[5], strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_shared_prompt_micro_batches_keep_a_group_together_and_fit_the_budget() -> None:
    prompts = [[BOS] * 3, [BOS, 1, 2], [BOS] * 6]
    items = [
        Item(Rollout(p, [EOS] * n, [0.0] * n, 1.0), 1.0)
        for p, lengths in zip(prompts, ([4, 2, 7], [1, 1], [5, 9, 2, 3]), strict=True)
        for n in lengths
    ]
    whole = shared_prompt_micro_batches(items, 1000)
    assert len(whole) == 1
    for budget in (1, 20, 40):
        mbs = shared_prompt_micro_batches(items, budget)
        assert sorted(map(id, (i for mb in mbs for i in mb))) == sorted(map(id, items))
        for mb in mbs:
            distinct = {tuple(i.rollout.prompt_ids) for i in mb}
            cost = sum(map(len, distinct)) + len(mb) * max(
                len(i.rollout.completion_ids) for i in mb
            )
            assert cost <= budget or len(mb) == 1
    # A group's items are consecutive: a prompt is cut across micro-batches at most where the
    # budget forces it, never interleaved with another group.
    order = [tuple(i.rollout.prompt_ids) for mb in mbs for i in mb]
    runs = [p for k, p in enumerate(order) if k == 0 or order[k - 1] != p]
    assert len(runs) == len(set(runs)) == 3


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
    """Groups of one prompt each, plus a group of different prompts (sharing nothing)."""
    pairs = _grouped_pairs(seed=1) + _pairs(3, seed=1)
    with torch.no_grad():
        logits, _, targets, mask = forward_completions(lm, pairs)
        old = token_logprobs(logits, targets, 1.0)
    groups: dict[object, list[Rollout]] = {}
    for i, (p, c) in enumerate(pairs):
        # Off-policy by a little, so ratios differ from 1 and clipping is exercised.
        r = Rollout(p, c, (old[i][mask[i]] - 0.1 * (i % 3)).tolist(), float(i % 3), 1.0)
        groups.setdefault(tuple(p) if i < len(pairs) - 3 else "mixed", []).append(r)
    return list(groups.values())


@pytest.mark.parametrize("layout", ["packed", "shared_prompt"])
@pytest.mark.parametrize("budget", [10_000, 40])
def test_every_layouts_step_has_the_padded_steps_gradients(layout: str, budget: int) -> None:
    results = []
    for each in ("padded", layout):
        lm = _lm()
        opt = torch.optim.SGD(lm.module.parameters(), lr=0.0)
        cfg = GRPOConfig(micro_batch_tokens=budget, layout=each)
        stats = train_step(lm, opt, _groups(lm), cfg)
        results.append(([p.grad.clone() for p in lm.module.parameters()], stats))
    (g1, s1), (g2, s2) = results
    assert s1["tokens"] == s2["tokens"] and s1["clip_frac"] == s2["clip_frac"]
    assert s1["loss"] == pytest.approx(s2["loss"], abs=1e-6)
    assert s1["grad_norm"] == pytest.approx(s2["grad_norm"], rel=1e-5)
    for a, b in zip(g1, g2, strict=True):
        assert torch.allclose(a, b, atol=1e-6)
