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

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.forward import completion_hidden_shared, distinct_prompts

PromptCompletion = tuple[Sequence[int], Sequence[int]]

REFERENCE_CHUNK_TOKENS = 16384
"""The fp32 reference forwards at most about this many prompt and completion tokens at once, so
its memory stays bounded however many groups a validator batch holds."""


@torch.no_grad()
def _reference_hidden(lm: CausalLM, pairs: Sequence[PromptCompletion]) -> list[torch.Tensor]:
    """[L, C] fp32 hidden states of every pair, each distinct prompt forwarded once per chunk and
    its completions batched on its cached keys (`completion_hidden_shared`): a group of G costs
    P + G*C tokens, not G*(P + C). fp32 moves by ~1e-7 with the batch: no bf16 ulp."""
    model = lm.cast("fp32")
    out: list[torch.Tensor] = []
    start = 0
    while start < len(pairs):
        stop, tokens = start, 0
        while stop < len(pairs) and (stop == start or tokens < REFERENCE_CHUNK_TOKENS):
            tokens += len(pairs[stop][0]) + len(pairs[stop][1])
            stop += 1
        chunk = pairs[start:stop]
        hidden, _, _ = completion_hidden_shared(model, chunk)
        out.extend(hidden[i, : len(c)].float().cpu() for i, (_, c) in enumerate(chunk))
        start = stop
    return out


@torch.no_grad()
def prefill_hidden(
    lm: CausalLM, sequences: Sequence[PromptCompletion], precision: str = "bf16"
) -> list[torch.Tensor]:
    """The final hidden states behind every completion token ([L, C], bf16, CPU) at `precision`:
    what a proof commits to, computed the same way by the worker that proves and the validator
    that checks.

    Each distinct prompt is forwarded alone once; each of its completions is then forwarded
    alone on a copy of the prompt's cached keys and values. Alone, because in bf16 a batch's
    shape moves every row's numbers (SmolLM2 on this CPU: a sequence prefilled with 5 others
    against alone pooled 1.17-1.42 ulp apart, as far as from the fp32 reference, while 1 and 2
    threads agree bit for bit): a completion's numbers depend on nothing but its prompt and
    itself, so a worker and a validator of one device class compute them identically however
    each batches its work. Sharing the prompt's prefill across its group costs P + G*C tokens
    instead of G*(P + C), for the worker and the validator alike."""
    model = lm.cast(precision)
    device = model.device
    prompts, owner = distinct_prompts(sequences)
    out: list[torch.Tensor | None] = [None] * len(sequences)
    for j, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError("every prompt needs at least one token")
        cache = DynamicCache(config=model.config)
        ids = torch.as_tensor([prompt], dtype=torch.long, device=device)
        # The prompt's last position predicts each completion's first token.
        first = model.final_hidden(ids, None, None, cache)[0, -1:]
        for i in (i for i, o in enumerate(owner) if o == j):
            completion = list(sequences[i][1])
            hidden = first
            if len(completion) > 1:
                # Every completion token but the last predicts the next one.
                ids = torch.as_tensor([completion[:-1]], dtype=torch.long, device=device)
                rest = model.final_hidden(ids, None, None, copy.deepcopy(cache))[0]
                hidden = torch.cat([first, rest])
            out[i] = hidden[: len(completion)].to(torch.bfloat16).cpu()
    return [h for h in out if h is not None]


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
    reference = _reference_hidden(lm, pairs)
    # The declared precision exactly as the worker's proof prefill computes it.
    declared = reference if precision == "fp32" else prefill_hidden(lm, pairs, precision)
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
