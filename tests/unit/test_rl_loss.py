import math

import pytest
import torch

from prime_swarm.libs.rl.loss import grpo_loss


def _lp(ratios):
    return torch.log(torch.tensor(ratios, dtype=torch.float64))


def test_on_policy_loss_is_minus_mean_advantage_per_token():
    lp = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    loss, stats = grpo_loss(lp, lp, torch.tensor([1.0, -2.0]), mask)
    # tokens: three with A=1, one with A=-2 -> -(1+1+1-2)/4
    assert float(loss) == pytest.approx(-0.25)
    assert stats["clip_frac"] == 0.0 and stats["mean_ratio"] == pytest.approx(1.0)


def test_clipping_hand_computed():
    # ratios 1.5, 0.5 (positive advantage) and 1.5, 0.5 (negative advantage), eps 0.2
    old = torch.zeros(2, 2, dtype=torch.float64)
    new = torch.stack([_lp([1.5, 0.5]), _lp([1.5, 0.5])])
    adv = torch.tensor([2.0, -1.0])
    loss, stats = grpo_loss(new, old, adv, torch.ones(2, 2), clip_eps=0.2)
    # A=+2: min(3.0, 2.4)=2.4 (clipped), min(1.0, 1.6)=1.0
    # A=-1: min(-1.5, -1.2)=-1.5, min(-0.5, -0.8)=-0.8 (clipped)
    expected = -(2.4 + 1.0 - 1.5 - 0.8) / 4
    assert float(loss) == pytest.approx(expected)
    assert stats["clip_frac"] == pytest.approx(0.5)
    assert stats["mean_ratio"] == pytest.approx(1.0)


def test_gradient_vanishes_where_clipped():
    new = _lp([1.5, 1.1]).reshape(1, 2).requires_grad_(True)
    loss, _ = grpo_loss(
        new, torch.zeros(1, 2, dtype=torch.float64), torch.tensor([1.0]), torch.ones(1, 2)
    )
    loss.backward()
    # d/dlp of -(r*A)/2 = -r/2 for the unclipped token; zero for the clipped one
    assert new.grad[0].tolist() == pytest.approx([0.0, -1.1 / 2])


def test_masked_tokens_are_ignored():
    new = _lp([2.0, 5.0]).reshape(1, 2)
    loss, stats = grpo_loss(
        new, torch.zeros(1, 2, dtype=torch.float64), torch.tensor([1.0]), torch.tensor([[1, 0]])
    )
    assert float(loss) == pytest.approx(-1.2)
    assert stats["tokens"] == 1.0


def test_kl_term_is_zero_at_reference_and_positive_elsewhere():
    lp = torch.full((1, 2), math.log(0.5), dtype=torch.float64)
    _, s0 = grpo_loss(lp, lp, torch.tensor([0.0]), torch.ones(1, 2), ref_logprobs=lp, kl_coef=0.1)
    _, s1 = grpo_loss(
        lp, lp, torch.tensor([0.0]), torch.ones(1, 2), ref_logprobs=lp - 1.0, kl_coef=0.1
    )
    assert s0["kl"] == pytest.approx(0.0)
    assert s1["kl"] > 0.0
