"""Token log-probabilities under temperature-scaled logits (the policy that actually sampled)."""

from __future__ import annotations

import torch


def scale_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    # Greedy decoding has no proper distribution; score it under the untempered policy.
    return logits.float() / (temperature if temperature > 0 else 1.0)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / T)[token] for logits [..., V] and tokens [...]."""
    logp = torch.log_softmax(scale_logits(logits, temperature), dim=-1)
    return logp.gather(-1, tokens[..., None].long()).squeeze(-1)
