"""Each term of the token loss against values computed by hand."""

import math

import pytest
import torch

from prime_swarm.libs.rl.advantages import group_advantages, is_informative
from prime_swarm.libs.rl.loss import LossConfig, grpo_loss, merge_stats, token_entropy

F64 = torch.float64
# Classic PPO, its ratio against the generating version: where the clips and the δ cap bind.
PPO = LossConfig(ratio_against="generator")


def _lp(values: list[float]) -> torch.Tensor:
    return torch.log(torch.tensor(values, dtype=F64))


def test_on_policy_loss_is_minus_mean_advantage_per_token() -> None:
    lp = torch.zeros(2, 3, dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    loss, stats = grpo_loss(lp, lp, torch.tensor([1.0, -2.0]), mask)
    # three tokens with A=1, one with A=-2, token-level mean: -(1+1+1-2)/4
    assert float(loss) == pytest.approx(-0.25)
    s = merge_stats([stats], 4.0)
    assert s["clip_frac"] == 0.0 and s["ratio_mean"] == pytest.approx(1.0)
    assert s["loss"] == pytest.approx(-0.25)


def test_a_step_that_trained_no_token_reports_an_unchanged_policy() -> None:
    """Every group zero-advantage: no micro-batch ran. Ratios and importance weights read 1 (a
    0 plotted as a collapse), the loss and the fractions 0."""
    s = merge_stats([], 0.0)
    assert s["tokens"] == 0.0 and s["loss"] == 0.0 and s["clip_frac"] == 0.0
    for k in ("ratio_mean", "ratio_min", "ratio_max", "is_weight_mean", "is_weight_max"):
        assert s[k] == pytest.approx(1.0), k


def test_two_sided_clip_with_different_epsilons() -> None:
    # eps_low 0.1, eps_high 0.3; ratios 1.5 and 0.5 under A=+2 and under A=-1.
    old = torch.zeros(2, 2, dtype=F64)
    new = torch.stack([_lp([1.5, 0.5]), _lp([1.5, 0.5])])
    cfg = LossConfig(eps_low=0.1, eps_high=0.3, ratio_against="generator")
    loss, stats = grpo_loss(new, old, torch.tensor([2.0, -1.0]), torch.ones(2, 2), cfg)
    # A=+2: min(3.0, 1.3*2=2.6)=2.6 (clipped high); min(1.0, 0.9*2=1.8)=1.0
    # A=-1: min(-1.5, -1.3)=-1.5; min(-0.5, -0.9)=-0.9 (clipped low)
    assert float(loss) == pytest.approx(-(2.6 + 1.0 - 1.5 - 0.9) / 4)
    s = merge_stats([stats], 4.0)
    assert s["clip_high_frac"] == pytest.approx(0.25)
    assert s["clip_low_frac"] == pytest.approx(0.25)
    assert s["clip_delta_frac"] == 0.0
    assert s["ratio_min"] == pytest.approx(0.5) and s["ratio_max"] == pytest.approx(1.5)


def test_delta_caps_negative_advantage_tokens() -> None:
    new = _lp([6.0, 3.0]).reshape(1, 2).requires_grad_(True)
    loss, stats = grpo_loss(
        new, torch.zeros(1, 2, dtype=F64), torch.tensor([-1.0]), torch.ones(1, 2), PPO
    )
    # r=6: min(-6, -1.2) = -6, capped at δ·A = -4; r=3 < δ: -3 stays. Loss -(-4-3)/2.
    assert float(loss.detach()) == pytest.approx(3.5)
    loss.backward()
    # The capped token has no gradient; the other: d/dlp of -(r·A)/2 = r/2.
    assert new.grad[0].tolist() == pytest.approx([0.0, 1.5])
    assert merge_stats([stats], 2.0)["clip_delta_frac"] == pytest.approx(0.5)


def test_gradient_vanishes_where_clipped() -> None:
    new = _lp([1.5, 1.1]).reshape(1, 2).requires_grad_(True)
    old, adv = torch.zeros(1, 2, dtype=F64), torch.tensor([1.0])
    loss, _ = grpo_loss(new, old, adv, torch.ones(1, 2), PPO)
    loss.backward()
    assert new.grad[0].tolist() == pytest.approx([0.0, -1.1 / 2])


def test_masked_tokens_are_ignored_and_constant_denominator() -> None:
    new = _lp([2.0, 5.0]).reshape(1, 2)
    old, adv, mask = torch.zeros(1, 2, dtype=F64), torch.tensor([1.0]), torch.tensor([[1, 0]])
    loss, stats = grpo_loss(new, old, adv, mask, PPO)
    assert float(loss) == pytest.approx(-1.2) and stats["tokens"] == 1.0
    # Constant normalization: the same sum over a denominator of 8 tokens.
    loss8, _ = grpo_loss(new, old, adv, mask, PPO, denominator=8.0)
    assert float(loss8) == pytest.approx(-1.2 / 8)


def test_truncated_importance_weight() -> None:
    # Trainer-side old policy 0.5, engine said 0.1: w = 5, truncated at 2. On-policy ratio 1.
    old = _lp([0.5, 0.5]).reshape(1, 2)
    inference = _lp([0.1, 0.4]).reshape(1, 2)  # w = 5 -> 2 and w = 1.25
    loss, stats = grpo_loss(
        old,
        old,
        torch.tensor([1.0]),
        torch.ones(1, 2),
        LossConfig(is_mode="truncate"),
        inference_logprobs=inference,
    )
    assert float(loss) == pytest.approx(-(2.0 + 1.25) / 2)
    s = merge_stats([stats], 2.0)
    assert s["is_truncated_frac"] == pytest.approx(0.5)
    assert s["is_weight_mean"] == pytest.approx(1.625) and s["is_weight_max"] == pytest.approx(2.0)


def test_decoupled_ratio_keeps_stale_tokens_in_the_gradient() -> None:
    # Two steps of training moved the tokens from 0.5 (generating version, which sampled them)
    # to 0.75 and 0.4 under the current weights. Classic PPO clips the first (r = 1.5 > 1.2 with
    # A > 0): no gradient. Decoupled: ratio 1 against this step's weights, weight π_θ/π_old
    # (1.5 and 0.8; truncated at 2), so both tokens keep a gradient of -w/2 (per log-prob).
    old = _lp([0.5, 0.5]).reshape(1, 2)
    current = _lp([0.75, 0.4]).reshape(1, 2)
    adv, mask = torch.tensor([1.0]), torch.ones(1, 2)
    classic = current.clone().requires_grad_(True)
    loss, stats = grpo_loss(classic, old, adv, mask, PPO)
    loss.backward()
    assert classic.grad[0].tolist() == pytest.approx([0.0, -0.8 / 2])
    assert merge_stats([stats], 2.0)["stale_clip_frac"] == pytest.approx(0.5)
    decoupled = current.clone().requires_grad_(True)
    cfg = LossConfig()  # the default
    assert cfg.ratio_against == "current"
    loss, stats = grpo_loss(decoupled, old, adv, mask, cfg)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(-(1.5 + 0.8) / 2)
    assert decoupled.grad[0].tolist() == pytest.approx([-1.5 / 2, -0.8 / 2])
    s = merge_stats([stats], 2.0)
    assert s["clip_frac"] == 0.0 and s["ratio_mean"] == pytest.approx(1.0)
    # ... and says what classic PPO would have clipped.
    assert s["stale_clip_frac"] == pytest.approx(0.5)
    assert s["is_weight_mean"] == pytest.approx((1.5 + 0.8) / 2)
    # With the engine's numbers the weight goes back to what sampled: π_θ/π_inference = 0.75/0.1
    # truncated at 2, and 0.4/0.4 = 1.
    inference = _lp([0.1, 0.4]).reshape(1, 2)
    loss, stats = grpo_loss(current, old, adv, mask, cfg, inference_logprobs=inference)
    assert float(loss) == pytest.approx(-(2.0 + 1.0) / 2)
    assert merge_stats([stats], 2.0)["is_truncated_frac"] == pytest.approx(0.5)


def test_masked_importance_weight() -> None:
    old = _lp([0.5, 0.5, 0.5]).reshape(1, 3)
    inference = _lp([0.1, 0.4, 0.9]).reshape(1, 3)  # w = 5 (out), 1.25 (in), 0.556 (in)
    cfg = LossConfig(is_mode="mask", is_low=0.6, is_high=2.0)
    loss, stats = grpo_loss(
        old, old, torch.tensor([1.0]), torch.ones(1, 3), cfg, inference_logprobs=inference
    )
    # w=0.556 is below 0.6 too: only the middle token remains, weighted by 1.25.
    assert float(loss) == pytest.approx(-1.25 / 3)
    assert merge_stats([stats], 3.0)["is_masked_frac"] == pytest.approx(2 / 3)
    none, _ = grpo_loss(
        old,
        old,
        torch.tensor([1.0]),
        torch.ones(1, 3),
        LossConfig(is_mode="none"),
        inference_logprobs=inference,
    )
    assert float(none) == pytest.approx(-1.0)


def test_entropy_bonus() -> None:
    # Uniform logits over 4 tokens: H = log 4 per position.
    logits = torch.zeros(1, 2, 4, dtype=F64)
    h = token_entropy(logits)
    assert h[0].tolist() == pytest.approx([math.log(4)] * 2)
    lp = torch.zeros(1, 2, dtype=F64)
    cfg = LossConfig(entropy_coef=0.01)
    loss, stats = grpo_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 2), cfg, entropy=h)
    assert float(loss) == pytest.approx(-1.0 - 0.01 * math.log(4))
    assert merge_stats([stats], 2.0)["entropy"] == pytest.approx(math.log(4))


def test_k3_kl_term() -> None:
    lp = torch.full((1, 2), math.log(0.5), dtype=F64)
    ref = lp - 1.0  # log(ref/π) = -1: k3 = e^-1 + 1 - 1 = e^-1
    cfg = LossConfig(kl_coef=0.1)
    loss, stats = grpo_loss(lp, lp, torch.tensor([0.0]), torch.ones(1, 2), cfg, ref_logprobs=ref)
    assert float(loss) == pytest.approx(0.1 * math.exp(-1))
    assert merge_stats([stats], 2.0)["kl"] == pytest.approx(math.exp(-1))
    _, at_ref = grpo_loss(lp, lp, torch.tensor([0.0]), torch.ones(1, 2), cfg, ref_logprobs=lp)
    assert at_ref["kl_sum"] == pytest.approx(0.0)


def test_group_advantages_with_and_without_std() -> None:
    # rewards 1, 0, 0, 0: mean 0.25, population std sqrt(3)/4
    a = group_advantages([1.0, 0.0, 0.0, 0.0], eps=0.0)
    assert a.tolist() == pytest.approx(
        [0.75 / (math.sqrt(3) / 4)] + [-0.25 / (math.sqrt(3) / 4)] * 3
    )
    b = group_advantages([1.0, 0.0, 0.0, 0.0], std_normalize=False)
    assert b.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert (
        is_informative([1.0, 0.0]) and not is_informative([0.3, 0.3]) and not is_informative([1.0])
    )


def test_merge_stats_over_micro_batches() -> None:
    lp = torch.zeros(1, 2, dtype=F64)
    _, a = grpo_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 2), denominator=3.0)
    _, b = grpo_loss(lp[:, :1], lp[:, :1], torch.tensor([-1.0]), torch.ones(1, 1), denominator=3.0)
    s = merge_stats([a, b], 3.0)
    assert s["tokens"] == 3.0 and s["loss"] == pytest.approx(-(1 + 1 - 1) / 3)
