"""The GRPO token loss: two-sided clipping with a δ cap, an importance correction for the gap
between the inference engine's numbers and the trainer's, optional entropy and k3-KL terms.

Three log-probabilities meet here, one per token:
- `logprobs`: the policy being trained (with grad);
- `old_logprobs`: the policy version that generated the rollout, computed by the trainer's own
  kind of forward (the validator's recomputation, hf at the pool's precision) - the PPO ratio
  r = π_θ / π_old compares like with like, so r == 1 exactly on-policy;
- `inference_logprobs`: what the worker's engine (vLLM, another GPU, bf16 kernels) reported when
  it sampled. Sampling followed *those* numbers, so the PPO estimate is off-policy by
  w = π_old / π_inference. INTELLECT-2 ignored w; with TIS/IcePop-style correction we weight each
  token by w truncated at `is_cap`, or drop tokens whose w leaves [is_low, is_high].

Asynchronous training adds a third gap: the generating version is up to `async_level` steps older
than the weights being trained. `ratio_against` chooses where PPO's trust region sits. "generator"
(classic PPO) clips r = π_θ / π_old, so a token the last two steps already pushed past 1 + eps
gets no gradient at all: stale data teaches little. "current" is the decoupled objective of AReaL
(Fu et al. 2025, arXiv:2505.24298): the ratio is taken against the weights at the start of this
step (one pass per batch: r == 1, the clip never binds, as in TRL's on-policy GRPO) and the
staleness becomes part of the truncated importance weight, w = π_θ / π_inference.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field


class LossConfig(BaseModel):
    """Everything the token loss depends on; the trainer takes it whole (PRIME_TRAINER_LOSS__*)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    eps_low: float = Field(0.2, ge=0, lt=1, description="Lower PPO clip: r below 1-eps_low.")
    eps_high: float = Field(0.2, ge=0, description="Upper PPO clip: r above 1+eps_high.")
    delta: float = Field(
        4.0,
        gt=1,
        description="Cap on the ratio of negative-advantage tokens (INTELLECT-2's δ, dual-clip "
        "PPO): without it one token with r=50 and A<0 can dominate a step.",
    )
    normalize: Literal["tokens", "constant"] = Field(
        "tokens",
        description="Divide the summed token loss by the step's sampled token count (every "
        "rollout's, zero-advantage ones too), or by a "
        "constant (groups x group size x max_new_tokens, Dr.GRPO/INTELLECT-2) so that long "
        "and short batches move the weights alike.",
    )
    std_normalize: bool = Field(
        True, description="Group advantage (r-mean)/(std+eps); False keeps r-mean (Dr.GRPO)."
    )
    adv_eps: float = Field(1e-6, gt=0, description="eps in (r-mean)/(std+eps).")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus (INTELLECT-2: 0.001).")
    kl_coef: float = Field(
        0.0, ge=0, description="k3-KL penalty against the initial policy; 0 skips its forward."
    )
    is_mode: Literal["none", "truncate", "mask"] = Field(
        "truncate",
        description="Inference/trainer mismatch correction: weight each token by w=π_old/π_inf "
        "truncated at is_cap (TIS), or keep w only inside [is_low, is_high] (IcePop), or none.",
    )
    is_cap: float = Field(2.0, gt=0, description="Truncation of w in 'truncate' mode.")
    is_low: float = Field(0.5, gt=0, description="Tokens with w below this are masked ('mask').")
    is_high: float = Field(2.0, gt=0, description="Tokens with w above this are masked ('mask').")
    ratio_against: Literal["generator", "current"] = Field(
        "current",
        description="PPO ratio against this step's starting weights (decoupled PPO: staleness "
        "goes into the importance weight, truncated or masked as is_mode says) or against the "
        "generating version (classic PPO: tokens the last steps already moved clip).",
    )


def importance_weights(
    target: torch.Tensor, behaviour: torch.Tensor | None, cfg: LossConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, kept) per token: the correction factor w = π_target / π_behaviour and which
    tokens it leaves in the loss."""
    if behaviour is None or cfg.is_mode == "none":
        ones = torch.ones_like(target)
        return ones, ones.bool()
    # Clamped log-ratio: a lying or broken engine cannot produce inf/nan weights.
    w = torch.exp((target - behaviour).clamp(-20.0, 20.0)).detach()
    if cfg.is_mode == "truncate":
        return w.clamp(max=cfg.is_cap), torch.ones_like(w, dtype=torch.bool)
    kept = (w >= cfg.is_low) & (w <= cfg.is_high)
    return torch.where(kept, w, torch.zeros_like(w)), kept


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H(softmax(logits)) per position, in nats, fp32."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig | None = None,
    *,
    inference_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Summed token loss / `denominator` (default: the real tokens in `mask`).

    logprobs, old_logprobs, inference_logprobs, ref_logprobs, entropy, mask: [N, L];
    advantages: [N]. A caller that splits a step into micro-batches passes the whole step's
    denominator to each, so accumulated gradients equal the one-batch gradient. The stats are
    sums and counts over this call's tokens (`merge_stats` turns them into step means).
    """
    cfg = cfg or LossConfig()
    m = mask.to(logprobs.dtype)
    n_tokens = float(m.sum())
    denom = float(denominator) if denominator is not None else max(n_tokens, 1.0)
    # Decoupled: the proximal policy is this step's own starting point, and the importance weight
    # corrects from there back to what sampled (inference_logprobs, else the generating version).
    proximal = logprobs.detach() if cfg.ratio_against == "current" else old_logprobs.detach()
    behaviour = inference_logprobs
    if cfg.ratio_against == "current" and behaviour is None:
        behaviour = old_logprobs
    log_ratio = logprobs - proximal
    ratio = torch.exp(log_ratio)
    adv = advantages.detach().to(logprobs.dtype)[:, None].expand_as(ratio)
    clipped_ratio = ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    surrogate = torch.minimum(ratio * adv, clipped_ratio * adv)
    # Dual clip: for A < 0 the min above is unbounded below as r grows; δ·A bounds it.
    negative = adv < 0
    surrogate = torch.where(negative, torch.maximum(surrogate, cfg.delta * adv), surrogate)
    weight, kept = importance_weights(proximal, behaviour, cfg)
    per_token = -surrogate * weight.to(logprobs.dtype)
    if entropy is not None and cfg.entropy_coef > 0:
        per_token = per_token - cfg.entropy_coef * entropy
    k3 = None
    if ref_logprobs is not None and cfg.kl_coef > 0:
        log_r = ref_logprobs.detach() - logprobs
        k3 = torch.exp(log_r) - log_r - 1.0
        per_token = per_token + cfg.kl_coef * k3
    loss = (per_token * m).sum() / denom
    with torch.no_grad():
        real = mask.bool()
        positive = adv > 0
        gen_ratio = torch.exp(logprobs.detach() - old_logprobs)
        r = ratio[real]

        def count(cond: torch.Tensor) -> float:
            return float((cond & real).sum())

        stats = {
            "loss_sum": float(loss.detach()) * denom,
            "tokens": n_tokens,
            "clip_low": count(negative & (ratio < 1.0 - cfg.eps_low)),
            "clip_high": count(positive & (ratio > 1.0 + cfg.eps_high)),
            # What classic PPO would clip: the ratio to the generating version outside the band
            # in the direction the advantage pushes (equals clip_low + clip_high there).
            "stale_clip": count(
                (positive & (gen_ratio > 1.0 + cfg.eps_high))
                | (negative & (gen_ratio < 1.0 - cfg.eps_low))
            ),
            "clip_delta": count(negative & (ratio > cfg.delta)),
            "ratio_sum": float(r.sum()),
            "ratio_min": float(r.min()) if r.numel() else 1.0,
            "ratio_max": float(r.max()) if r.numel() else 1.0,
            "is_weight_sum": float(weight[real].sum()),
            "is_weight_max": float(weight[real].max()) if r.numel() else 1.0,
            "is_masked": count(~kept),
            "is_truncated": count(
                (torch.exp(proximal - behaviour) > cfg.is_cap)
                if behaviour is not None and cfg.is_mode == "truncate"
                else torch.zeros_like(real)
            ),
            "kl_sum": float(k3[real].sum()) if k3 is not None else 0.0,
            "entropy_sum": float(entropy[real].sum()) if entropy is not None else 0.0,
        }
    return loss, stats


SUMMED = ("loss_sum", "tokens", "clip_low", "clip_high", "clip_delta", "stale_clip", "ratio_sum")
SUMMED += ("is_weight_sum", "is_masked", "is_truncated", "kl_sum", "entropy_sum")


def merge_stats(parts: list[dict[str, float]], denominator: float) -> dict[str, float]:
    """Micro-batch stats -> the step's: fractions per token, means, extremes. A step that trained
    no token (every group zero-advantage) reports ratios and importance weights of 1, as for
    their extremes: the policy is unchanged, and a 0 read as a collapse on the dashboard."""
    total = {k: sum(p[k] for p in parts) for k in SUMMED}
    n = max(total["tokens"], 1.0)
    return {
        "loss": total["loss_sum"] / max(denominator, 1.0),
        "tokens": total["tokens"],
        "clip_low_frac": total["clip_low"] / n,
        "clip_high_frac": total["clip_high"] / n,
        "clip_delta_frac": total["clip_delta"] / n,
        "clip_frac": (total["clip_low"] + total["clip_high"]) / n,
        "stale_clip_frac": total["stale_clip"] / n,
        "ratio_mean": total["ratio_sum"] / n if total["tokens"] else 1.0,
        "ratio_min": min((p["ratio_min"] for p in parts), default=1.0),
        "ratio_max": max((p["ratio_max"] for p in parts), default=1.0),
        "is_weight_mean": total["is_weight_sum"] / n if total["tokens"] else 1.0,
        "is_weight_max": max((p["is_weight_max"] for p in parts), default=1.0),
        "is_masked_frac": total["is_masked"] / n,
        "is_truncated_frac": total["is_truncated"] / n,
        "kl": total["kl_sum"] / n,
        "entropy": total["entropy_sum"] / n,
    }
