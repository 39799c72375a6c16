"""GRPO advantages: each completion is scored against the other samples of its own prompt."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def group_advantages(
    rewards: Sequence[float] | torch.Tensor, eps: float = 1e-6, std_normalize: bool = True
) -> torch.Tensor:
    """(r - mean) / (std + eps) within one group (r - mean without std_normalize); all zeros
    when every reward is equal.

    std is the population std (divide by n), so a group of two gets advantages of about +-1.
    A zero-std group carries no preference, and dividing its ~0 deviations by eps would only
    amplify float noise, hence the explicit zeros.
    """
    r = torch.as_tensor(rewards, dtype=torch.float32)
    if r.numel() == 0:
        return r
    std = r.std(unbiased=False)
    if float(std) <= eps:
        return torch.zeros_like(r)
    centred = r - r.mean()
    return centred / (std + eps) if std_normalize else centred


def is_informative(rewards: Sequence[float], eps: float = 1e-6) -> bool:
    """False for a zero-variance group: its advantages are all zero, it carries no gradient
    (the online filter drops it and refills the batch)."""
    return len(rewards) > 1 and max(rewards) - min(rewards) > eps
