"""Token sequences batched into one tensor: left-aligned for a prefill, right for decoding."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pad_right(
    seqs: Sequence[Sequence[int]], pad_id: int, multiple: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [N,T], attention_mask [N,T]) with each sequence left-aligned; T is the longest
    sequence rounded up to a multiple of `multiple`."""
    width = -(-max((len(s) for s in seqs), default=0) // multiple) * multiple
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
