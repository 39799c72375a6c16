"""A CPU stand-in for another device class: the same weights, GPU-like arithmetic.

Two machines that both "compute in bf16" differ where they round and in what order they add:
a GPU's tensor cores multiply bf16 tiles and accumulate in fp32 over split-K blocks whose
partial results are written out (rounded) and summed, in an order fixed by the kernel's tiling.
The CPU validator's oneDNN GEMM accumulates each dot product in one fp32 pass. This emulator
makes every linear layer a split-K GEMM: the reduction dimension is cut into `splits` blocks,
each block's product is rounded to bf16 (the partial written to the workspace) and the partials
are summed in reverse order before the output is rounded. `splits` is the knob that was tuned so
the 104M Qwen2 of bench/toploc/cross_device.py, against the CPU validator's bf16 prefill, shows
the honest noise an H100 showed (pooled mantissa error p50 0.87 ulp): see `tune` below and
bench/results/toploc.json `models.*.device_emulator`.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from prime_swarm.libs.model.causal_lm import CausalLM


class SplitKLinear(nn.Linear):
    """nn.Linear computed as a split-K GEMM with bf16-rounded partials (see module doc)."""

    splits: int = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        if self.weight.dtype != torch.bfloat16:
            return super().forward(x)
        k = x.shape[-1]
        bounds = [k * s // self.splits for s in range(self.splits + 1)]
        acc = torch.zeros((*x.shape[:-1], self.out_features), dtype=torch.float32, device=x.device)
        for a, b in reversed(list(zip(bounds[:-1], bounds[1:], strict=True))):
            part = x[..., a:b].float() @ self.weight[:, a:b].float().T
            acc = acc + part.to(torch.bfloat16).float()
        if self.bias is not None:
            acc = acc + self.bias.float()
        return acc.to(x.dtype)


def emulated(lm: CausalLM, splits: int) -> CausalLM:
    """A copy of `lm` whose linear layers (not the LM head: the pool's head is fp32) compute as
    split-K GEMMs with `splits` blocks. Class swaps survive `CausalLM.cast`'s deepcopy."""
    module = copy.deepcopy(lm.module)
    head = module.get_output_embeddings()
    for sub in module.modules():
        if type(sub) is nn.Linear and sub is not head:
            sub.__class__ = type(f"SplitK{splits}Linear", (SplitKLinear,), {"splits": splits})
    return CausalLM(module.eval(), lm.tokenizer, lm.source)
