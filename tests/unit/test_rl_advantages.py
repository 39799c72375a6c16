import pytest
import torch

from prime_swarm.libs.rl.advantages import group_advantages


def test_hand_computed_group():
    # mean 0.5, population std 0.5
    adv = group_advantages([1.0, 0.0, 1.0, 0.0], eps=0.0)
    assert adv.tolist() == [1.0, -1.0, 1.0, -1.0]


def test_uneven_group():
    # rewards 0, 0, 0.9: mean 0.3, population std sqrt(0.18)
    adv = group_advantages([0.0, 0.0, 0.9], eps=0.0)
    std = 0.18**0.5
    assert adv.tolist() == pytest.approx([-0.3 / std, -0.3 / std, 0.6 / std])
    assert float(adv.sum()) == pytest.approx(0.0, abs=1e-6)


def test_zero_std_gives_zero_advantage():
    assert group_advantages([0.7] * 8).tolist() == [0.0] * 8
    assert group_advantages([]).numel() == 0


def test_groups_are_normalised_independently():
    a, b = (group_advantages(g) for g in ([0.0, 1.0], [0.2, 0.2]))
    assert torch.allclose(a, torch.tensor([-1.0, 1.0]), atol=1e-5)
    assert b.tolist() == [0.0, 0.0]
