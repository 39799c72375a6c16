"""Token log-probabilities under temperature-scaled logits (the policy that actually sampled)."""

from __future__ import annotations

import torch


def scale_logits(logits: torch.Tensor, temperature: float | torch.Tensor) -> torch.Tensor:
    """logits / T in fp32; T may be a tensor broadcasting against logits[..., 0].

    Greedy decoding (T == 0) has no proper distribution; it is scored under the untempered one.
    """
    if isinstance(temperature, torch.Tensor):
        t = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
        return logits.float() / t[..., None].float()
    return logits.float() / (temperature if temperature > 0 else 1.0)


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float | torch.Tensor
) -> torch.Tensor:
    """log softmax(logits / T)[token] for logits [..., V] and tokens [...]."""
    logp = torch.log_softmax(scale_logits(logits, temperature), dim=-1)
    return logp.gather(-1, tokens[..., None].long()).squeeze(-1)
