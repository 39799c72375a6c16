"""One GRPO optimizer step over verified rollouts, as the trainer service calls it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.rl.advantages import group_advantages
from prime_swarm.libs.rl.defaults import RL
from prime_swarm.libs.rl.forward import forward_completions
from prime_swarm.libs.rl.logprobs import token_logprobs
from prime_swarm.libs.rl.loss import grpo_loss


@dataclass
class Rollout:
    prompt_ids: list[int]
    completion_ids: list[int]
    # From the policy version that generated it (recomputed by the validator), one per token.
    behaviour_logprobs: list[float]
    reward: float
    # The lease's temperature: the ratio compares the same tempered distributions it sampled.
    temperature: float = 1.0


# All rollouts of a group answer the same prompt; advantages are computed within a group.
RolloutGroup = Sequence[Rollout]


@dataclass
class GRPOConfig:
    clip_eps: float = RL.clip_eps
    max_grad_norm: float = RL.max_grad_norm
    adv_eps: float = 1e-6


def make_optimizer(model: CausalLM, lr: float = RL.lr) -> torch.optim.Optimizer:
    """The optimizer the defaults were tuned with (AdamW, no weight decay)."""
    return torch.optim.AdamW(model.module.parameters(), lr=lr, weight_decay=0.0)


def grpo_step(
    model: CausalLM,
    optimizer: torch.optim.Optimizer,
    batch: Sequence[RolloutGroup],
    cfg: GRPOConfig | None = None,
) -> dict[str, float]:
    """Advantages per group, one padded forward, clipped loss, backward, clip, step.

    Rollouts with zero advantage (groups whose samples all scored the same) are left out of the
    forward: they add no gradient and would only dilute the token mean.
    """
    cfg = cfg or GRPOConfig()
    rewards = [r.reward for g in batch for r in g]
    used: list[tuple[Rollout, float]] = []
    for group in batch:
        adv = group_advantages([r.reward for r in group], cfg.adv_eps)
        used += [(r, float(a)) for r, a in zip(group, adv, strict=True) if a != 0.0]
    stats = {
        "reward_mean": sum(rewards) / max(len(rewards), 1),
        "groups": float(len(batch)),
        "rollouts_used": float(len(used)),
        "loss": 0.0,
        "clip_frac": 0.0,
        "mean_ratio": 1.0,
        "grad_norm": 0.0,
        "tokens": 0.0,
    }
    if not used:
        return stats  # nothing to learn from; the version still advances with unchanged weights
    model.module.train()
    pairs = [(r.prompt_ids, r.completion_ids) for r, _ in used]
    logits, _, targets, mask = forward_completions(model, pairs)
    temps = torch.tensor([r.temperature for r, _ in used], device=logits.device)
    logprobs = token_logprobs(logits, targets, temps[:, None])
    old = torch.zeros_like(logprobs)
    for i, (r, _) in enumerate(used):
        if len(r.behaviour_logprobs) != len(r.completion_ids):
            raise ValueError("behaviour_logprobs must have one entry per completion token")
        old[i, : len(r.behaviour_logprobs)] = torch.tensor(r.behaviour_logprobs)
    advantages = torch.tensor([a for _, a in used], device=logprobs.device)
    loss, loss_stats = grpo_loss(logprobs, old, advantages, mask, clip_eps=cfg.clip_eps)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.module.parameters(), cfg.max_grad_norm)
    optimizer.step()
    model.module.eval()
    stats.update(loss_stats, grad_norm=float(grad_norm))
    return stats
