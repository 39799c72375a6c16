"""The one proof prefill, and the validator's own numbers for a group.

`prefill_hidden` is what a proof commits to: the worker proves over it (libs/rollout/answer.py)
and the validator's second opinion recomputes it; no generation backend computes proofs.

The validator's own numbers, what every verdict is measured against:

Two recomputations of the submitted tokens:

- the **reference**, in fp32 (TF32 off). fp32 recomputations agree across engines and devices to
  about 1e-6 relative, far below one bf16 ulp (4e-3), so the reference does not depend on which
  machine the validator runs on, and an honest worker's difference from it is its own rounding
  only (one-sided noise), never the validator's too;
- the **declared** recomputation, in the precision the worker declared (bf16 or fp16; skipped for
  fp32, which is the reference). Its difference from the reference is the honest noise scale of
  this model at this depth in that precision, measured on the very tokens being judged: the
  weight statistic divides by it, so one limit holds at 2 layers and at 30.

`decode_logits` is the second opinion's recomputation: a KV-cached decode of the claimed tokens in
the declared precision, the path an `hf` worker sampled on, for suspects only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.rl.forward import completion_hidden

PromptCompletion = tuple[Sequence[int], Sequence[int]]

PROOF_WIDTH_MULTIPLE = 32
"""The fp32 reference pads every sequence to a multiple of this many tokens and batches only
sequences of one padded width together (fp32 moves by ~1e-7 with the batch: no bf16 ulp)."""


def _width(pair: PromptCompletion) -> int:
    n = len(pair[0]) + len(pair[1])
    return -(-n // PROOF_WIDTH_MULTIPLE) * PROOF_WIDTH_MULTIPLE


@torch.no_grad()
def _hidden(
    lm: CausalLM, pairs: Sequence[PromptCompletion], precision: str, alone: bool = False
) -> list[torch.Tensor]:
    """[L, C] fp32 copies of the hidden states at `precision`: one padded forward per padded
    width, or (`alone`) one unpadded forward per sequence."""
    out: list[torch.Tensor | None] = [None] * len(pairs)
    buckets: dict[int, list[int]] = {}
    for i, pair in enumerate(pairs):
        buckets.setdefault(i if alone else _width(pair), []).append(i)
    model = lm.cast(precision)
    for idx in buckets.values():
        multiple = 1 if alone else PROOF_WIDTH_MULTIPLE
        hidden, _, _ = completion_hidden(model, [pairs[i] for i in idx], multiple)
        for row, i in enumerate(idx):
            out[i] = hidden[row, : len(pairs[i][1])].float().cpu()
    return [h for h in out if h is not None]


def prefill_hidden(
    lm: CausalLM, sequences: Sequence[PromptCompletion], precision: str = "bf16"
) -> list[torch.Tensor]:
    """The final hidden states behind every completion token ([L, C], bf16, CPU) at `precision`:
    what a proof commits to, computed the same way by the worker that proves and the validator
    that checks.

    One forward per sequence, alone: in bf16 a batch's shape moves every row's numbers (SmolLM2
    on this CPU: a sequence prefilled with 5 others against alone pooled 1.17-1.42 ulp apart,
    as far as from the fp32 reference, while 1 and 2 threads agree bit for bit). Alone, a
    sequence's numbers depend on nothing but itself, so a worker and a validator of one device
    class compute them identically however each batches its work."""
    return [h.to(torch.bfloat16) for h in _hidden(lm, sequences, precision, alone=True)]


@dataclass
class Recomputed:
    """One completion's recomputation by the validator."""

    reference: torch.Tensor
    """[L, C] fp32 final hidden states: what proofs and the sampling replay are judged against."""
    declared: torch.Tensor
    """[L, C] the same in the declared precision, rounded to bf16 (the proof's format)."""


def recompute(lm: CausalLM, pairs: Sequence[PromptCompletion], precision: str) -> list[Recomputed]:
    """Both recomputations of every (prompt, completion) pair, one prefill each for the lot."""
    if not pairs:
        return []
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference is fp32, not TF32
    reference = _hidden(lm, pairs, "fp32")
    # The declared precision exactly as the worker's proof prefill computes it.
    declared = reference if precision == "fp32" else _hidden(lm, pairs, precision, alone=True)
    return [
        Recomputed(ref, dec.to(torch.bfloat16))
        for ref, dec in zip(reference, declared, strict=True)
    ]


@torch.no_grad()
def decode_logits(
    lm: CausalLM, prompt: Sequence[int], completions: Sequence[Sequence[int]], precision: str
) -> list[torch.Tensor]:
    """fp32 logits [L, V] before each claimed token, from a KV-cached decode in `precision` that
    feeds the claimed tokens back one step at a time (teacher-forced): the numbers an `hf` worker
    sampled from, up to its batch composition."""
    lm = lm.cast(precision)
    n = len(completions)
    width = max(len(c) for c in completions)
    device = lm.device
    ids = torch.as_tensor([list(prompt)] * n, dtype=torch.long, device=device)
    attn = torch.ones_like(ids)
    positions = torch.arange(ids.shape[1], device=device).expand(n, -1)
    cache = DynamicCache(config=lm.config)
    last = lm.final_hidden(ids, attn, positions, cache)[:, -1]
    steps = [lm.head_logits(last).cpu()]
    fed = torch.full((n, width), lm.pad_id, dtype=torch.long)
    for i, c in enumerate(completions):
        fed[i, : len(c)] = torch.as_tensor(list(c), dtype=torch.long)
    for k in range(width - 1):
        attn = torch.cat([attn, torch.ones((n, 1), dtype=attn.dtype, device=device)], dim=1)
        positions = positions[:, -1:] + 1
        last = lm.final_hidden(fed[:, k : k + 1].to(device), attn, positions, cache)[:, -1]
        steps.append(lm.head_logits(last).cpu())
    logits = torch.stack(steps, dim=1)  # [n, width, V]
    return [logits[i, : len(c)] for i, c in enumerate(completions)]
