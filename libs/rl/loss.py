"""GRPO's token-level clipped surrogate (PPO-style ratio clipping, KL-free by default)."""

from __future__ import annotations

import torch


def grpo_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate averaged over every completion token of the batch.

    logprobs, behaviour_logprobs, mask: [N, L]; advantages: [N] (one per sequence). The ratio is
    against the policy that generated the rollout, which in async RL is 1-2 versions old, so
    clipping is what keeps the stale data from pushing the policy too far. Averaging over tokens
    (not per sequence first) gives long and short completions equal weight per token.
    With `ref_logprobs` and kl_coef > 0, adds the k3 KL estimator against a reference policy.
    """
    m = mask.to(logprobs.dtype)
    n_tokens = m.sum().clamp(min=1.0)
    ratio = torch.exp(logprobs - behaviour_logprobs.detach())
    adv = advantages.detach().to(logprobs.dtype)[:, None]
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv
    per_token = -torch.minimum(unclipped, clipped)
    kl = torch.zeros((), dtype=logprobs.dtype)
    if ref_logprobs is not None and kl_coef > 0:
        log_r = ref_logprobs.detach() - logprobs
        k3 = torch.exp(log_r) - log_r - 1.0
        kl = (k3 * m).sum() / n_tokens
        per_token = per_token + kl_coef * k3
    loss = (per_token * m).sum() / n_tokens
    with torch.no_grad():
        stats = {
            "loss": float(loss),
            "clip_frac": float(((clipped < unclipped).to(m.dtype) * m).sum() / n_tokens),
            "mean_ratio": float((ratio * m).sum() / n_tokens),
            "kl": float(kl),
            "tokens": float(m.sum()),
        }
    return loss, stats
