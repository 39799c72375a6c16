"""One padded forward over many (prompt, completion) pairs, aligned to completion tokens.

Shared by the validator's prefill (no grad) and the trainer's GRPO step (with grad), so both see
the same alignment: row k of a completion's outputs is the position that *predicted* token k.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from prime_swarm.libs.model.gpt import TinyGPT

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


def forward_completions(
    model: TinyGPT, pairs: Sequence[PromptCompletion]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run one right-padded forward; return completion-aligned tensors.

    Returns (logits [N,L,V], hidden [N,L,C], targets [N,L], mask [N,L]) with L the longest
    completion: logits[i, k] = lm_head(hidden[i, k]) is the distribution that predicted
    targets[i, k] = completion_i[k]; mask marks real completion tokens.
    """
    if any(len(p) == 0 for p, _ in pairs):
        raise ValueError("every prompt needs at least one token (the BOS)")
    device = next(model.parameters()).device
    ids, attn = pad_right([[*p, *c] for p, c in pairs], model.config.pad_token_id)
    ids, attn = ids.to(device), attn.to(device)
    logits, hidden = model(ids, attention_mask=attn)
    n_comp = torch.tensor([len(c) for _, c in pairs], device=device)
    width = int(n_comp.max()) if len(pairs) else 0
    k = torch.arange(width, device=device)
    prompt_len = torch.tensor([len(p) for p, _ in pairs], device=device)
    src = (prompt_len[:, None] - 1 + k[None, :]).clamp(max=ids.shape[1] - 1)  # [N,L]
    mask = k[None, :] < n_comp[:, None]
    targets = ids.gather(1, (src + 1).clamp(max=ids.shape[1] - 1)).masked_fill(~mask, 0)
    take_logits = logits.gather(1, src[:, :, None].expand(-1, -1, logits.shape[-1]))
    take_hidden = hidden.gather(1, src[:, :, None].expand(-1, -1, hidden.shape[-1]))
    return take_logits, take_hidden, targets, mask
