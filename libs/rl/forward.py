"""One padded forward over many (prompt, completion) pairs, aligned to completion tokens.

Shared by the validator's prefill (no grad) and the trainer's GRPO step (with grad), so both see
the same alignment: row k of a completion's outputs is the position that *predicted* token k.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from prime_swarm.libs.model.causal_lm import CausalLM

PromptCompletion = tuple[Sequence[int], Sequence[int]]


def pad_right(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [N,T], attention_mask [N,T]) with each sequence left-aligned."""
    width = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


def pad_left(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [N,T], attention_mask [N,T]) with each sequence right-aligned (for decoding)."""
    width = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.as_tensor(list(s), dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids, mask


def completion_hidden(
    lm: CausalLM, pairs: Sequence[PromptCompletion]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One right-padded forward; (hidden [N,L,C], targets [N,L], mask [N,L]).

    L is the longest completion; hidden[i, k] is the final hidden state that predicted
    targets[i, k] = completion_i[k]; mask marks real completion tokens. Right padding needs no
    position ids: a causal model never lets a real token see the padding after it.
    """
    if any(len(p) == 0 for p, _ in pairs):
        raise ValueError("every prompt needs at least one token")
    device = lm.device
    ids, attn = pad_right([[*p, *c] for p, c in pairs], lm.pad_id)
    ids, attn = ids.to(device), attn.to(device)
    hidden = lm.final_hidden(ids, attn)
    n_comp = torch.tensor([len(c) for _, c in pairs], device=device)
    width = int(n_comp.max()) if len(pairs) else 0
    k = torch.arange(width, device=device)
    prompt_len = torch.tensor([len(p) for p, _ in pairs], device=device)
    src = (prompt_len[:, None] - 1 + k[None, :]).clamp(max=ids.shape[1] - 1)  # [N,L]
    mask = k[None, :] < n_comp[:, None]
    targets = ids.gather(1, (src + 1).clamp(max=ids.shape[1] - 1)).masked_fill(~mask, 0)
    take = hidden.gather(1, src[:, :, None].expand(-1, -1, hidden.shape[-1]))
    return take, targets, mask


def forward_completions(
    lm: CausalLM, pairs: Sequence[PromptCompletion]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`completion_hidden` plus the fp32 logits over it: (logits, hidden, targets, mask)."""
    hidden, targets, mask = completion_hidden(lm, pairs)
    return lm.head_logits(hidden), hidden, targets, mask
