"""Cheaper work a dishonest worker might pass off as the pool's: the weight attacks both toploc
benchmarks run (the same quantizers and neighbours, so their figures compare), and the names of
the attacks every benchmark must detect."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from prime_swarm.libs.model.causal_lm import CausalLM

Transform = Callable[[torch.Tensor], torch.Tensor]

REQUIRED = [
    "different_model_other_checkpoint",
    "different_model_other_seed",
    "quantized_int8",
    "quantized_int4",
    "finetuned_neighbour_1pct_rms",
    "tampered_prompt",
    "tampered_completion_token",
    "truncated_completion",
    "sampling_ignores_seed",
    "inflated_reward",
    "replayed_submission",
    "forged_proof",
]


def perturbed(lm: CausalLM, fn: Transform) -> CausalLM:
    """A copy of `lm` whose every weight matrix went through `fn` (norms and biases kept)."""
    module = copy.deepcopy(lm.module)
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim >= 2:
                p.copy_(fn(p.float()).to(p.dtype))
    return CausalLM(module.eval(), lm.tokenizer, lm.source)


def quantized(bits: int) -> Transform:
    """Symmetric per-output-channel quantize-dequantize: what an int8/int4 worker computes with."""
    levels = 2 ** (bits - 1) - 1

    def fn(w: torch.Tensor) -> torch.Tensor:
        # An all-zero row (a pad token's embedding) keeps its zeros, not 0/0.
        scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / levels
        return (w / scale).round().clamp(-levels, levels) * scale

    return fn


def fp8(w: torch.Tensor) -> torch.Tensor:
    """Per-output-channel scaled float8 (e4m3) weights, as an fp8 checkpoint holds them."""
    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 448.0
    return (w / scale).to(torch.float8_e4m3fn).float() * scale


def neighbour(rel: float, seed: int = 0) -> Transform:
    """A fine-tuned neighbour: every tensor moved by Gaussian noise of `rel` x its RMS."""
    gen = torch.Generator().manual_seed(seed)

    def fn(w: torch.Tensor) -> torch.Tensor:
        return w + rel * w.pow(2).mean().sqrt() * torch.randn(w.shape, generator=gen)

    return fn
