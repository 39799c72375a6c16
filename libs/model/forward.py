"""One padded forward over many (prompt, completion) pairs, aligned to completion tokens.

Shared by the validator's prefill (no grad) and the trainer's GRPO step (with grad), so both see
the same alignment: row k of a completion's outputs is the position that *predicted* token k.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.padding import pad_right

PromptCompletion = tuple[Sequence[int], Sequence[int]]


def completion_hidden(
    lm: CausalLM, pairs: Sequence[PromptCompletion], width_multiple: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One right-padded forward; (hidden [N,L,C], targets [N,L], mask [N,L]).

    L is the longest completion; hidden[i, k] is the final hidden state that predicted
    targets[i, k] = completion_i[k]; mask marks real completion tokens. Right padding needs no
    position ids: a causal model never lets a real token see the padding after it. The padded
    width is rounded up to `width_multiple`.
    """
    if any(len(p) == 0 for p, _ in pairs):
        raise ValueError("every prompt needs at least one token")
    device = lm.device
    ids, attn = pad_right([[*p, *c] for p, c in pairs], lm.pad_id, width_multiple)
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


# ---------------------------------------------------------------------- packing
#
# Padding every sequence to the longest wastes the forward on pad tokens when lengths vary (as
# GRPO completions do). Packing lays several sequences end to end in one row instead. transformers
# 5 handles the rest from the position ids alone: with no 2D attention mask, `create_causal_mask`
# reads a restart of position_ids as a sequence boundary and builds a block-diagonal causal mask
# (sdpa, eager, flex), and RoPE sees each sequence from position 0, as the padded forward does.


class RowPacker:
    """First-fit rows of `width` tokens; fed longest first, this is first-fit decreasing.

    Shared by `pack_rows` and the trainer's micro-batching, so a micro-batch is cut exactly where
    the forward's own packing would need one row too many.
    """

    def __init__(self, width: int) -> None:
        self.width = width
        self.rows: list[list[int]] = []
        self.free: list[int] = []

    def slot(self, n: int) -> int | None:
        """The first row with room for `n` tokens, or None (a new row is needed)."""
        return next((r for r, space in enumerate(self.free) if n <= space), None)

    def add(self, index: int, n: int) -> None:
        r = self.slot(n)
        if r is None:
            # A new row; a sequence longer than the width fills it alone.
            self.rows.append([])
            self.free.append(self.width)
            r = len(self.rows) - 1
        self.rows[r].append(index)
        self.free[r] -= n


def pack_rows(lengths: Sequence[int], width: int) -> list[list[int]]:
    """Indices of `lengths` grouped into rows of at most `width` tokens (first-fit decreasing;
    ties keep their order, so equal inputs always pack alike)."""
    packer = RowPacker(width)
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        packer.add(i, lengths[i])
    return packer.rows


def _one_row_only(lm: CausalLM) -> bool:
    """Whether this model's attention needs everything in one packed row; refuses attentions
    that would ignore the packing (sequences would silently see each other)."""
    impl = getattr(lm.module.config, "_attn_implementation", None) or "eager"
    if impl in ("sdpa", "eager", "flex_attention"):
        # `create_causal_mask` turns restarted position ids into a block-diagonal mask.
        return False
    if "flash" in impl:
        # The flash path reads packed position ids (as cu_seq_lens) only in a batch of one row.
        return True
    raise ValueError(f"packing is not supported with attention {impl!r}; set packing=False")


def completion_hidden_packed(
    lm: CausalLM, pairs: Sequence[PromptCompletion], row_tokens: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`completion_hidden` over packed rows: the same (hidden [N,L,C], targets [N,L], mask
    [N,L]), in the order of `pairs`.

    Rows are `row_tokens` wide, or as wide as the longest sequence (then attention, quadratic
    in the row on sdpa/eager, never costs more than the padded forward's). Under flash attention
    everything goes in one row.
    """
    if any(len(p) == 0 for p, _ in pairs):
        raise ValueError("every prompt needs at least one token")
    device = lm.device
    seqs = [[*p, *c] for p, c in pairs]
    lengths = [len(s) for s in seqs]
    width = max([*lengths, row_tokens or 0])
    if _one_row_only(lm):
        rows, width = [list(range(len(seqs)))], sum(lengths)
    else:
        rows = pack_rows(lengths, width)
    ids = torch.full((len(rows), width), lm.pad_id, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    start = [0] * len(seqs)  # where each sequence begins in the flattened [rows*width] layout
    for r, row in enumerate(rows):
        offset = 0
        for i in row:
            n = lengths[i]
            ids[r, offset : offset + n] = torch.as_tensor(seqs[i], dtype=torch.long)
            positions[r, offset : offset + n] = torch.arange(n)
            start[i] = r * width + offset
            offset += n
        # The tail restarts at 0 too: a block of its own, after every real token (causal), so
        # no real token ever attends to it.
        positions[r, offset:] = torch.arange(width - offset)
    ids, positions = ids.to(device), positions.to(device)
    hidden = lm.final_hidden(ids, None, positions).reshape(len(rows) * width, -1)
    flat_ids = ids.reshape(-1)
    n_comp = torch.tensor([len(c) for _, c in pairs], device=device)
    k = torch.arange(int(n_comp.max()) if len(pairs) else 0, device=device)
    mask = k[None, :] < n_comp[:, None]
    # Positions past a completion's end repeat its last row: finite values the mask drops,
    # and never a neighbour's (which would still be harmless, but this keeps rows independent).
    first = torch.tensor([s + len(p) - 1 for s, (p, _) in zip(start, pairs, strict=True)])
    first = first.to(device)
    src = first[:, None] + torch.minimum(k[None, :], (n_comp[:, None] - 1).clamp(min=0))
    targets = flat_ids[(src + 1).clamp(max=flat_ids.numel() - 1)].masked_fill(~mask, 0)
    return hidden[src], targets, mask


def forward_completions_packed(
    lm: CausalLM, pairs: Sequence[PromptCompletion], row_tokens: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`forward_completions` with packed rows: the same (logits, hidden, targets, mask)."""
    hidden, targets, mask = completion_hidden_packed(lm, pairs, row_tokens)
    return lm.head_logits(hidden), hidden, targets, mask


# ---------------------------------------------------------------------- shared prompts
#
# A GRPO group is G completions of one prompt. Padded or packed, the prompt is run G times; here
# it is run once and its keys and values are handed to each of its completions through the KV
# cache. A group then costs P + G*C tokens instead of G*(P + C) (SmolLM2 on two-digit addition:
# 47-token prompts, ~20-token completions, 8 per group: 2.6x fewer tokens). Backward reaches the
# prompt's positions through the cache, so the gradient is the full forward's up to float order.


def distinct_prompts(pairs: Sequence[PromptCompletion]) -> tuple[list[list[int]], list[int]]:
    """(each distinct prompt once, in order of first appearance; the index of each pair's)."""
    index: dict[tuple[int, ...], int] = {}
    owner = [index.setdefault(tuple(p), len(index)) for p, _ in pairs]
    return [list(p) for p in index], owner


def completion_hidden_shared(
    lm: CausalLM, pairs: Sequence[PromptCompletion]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`completion_hidden` with each distinct prompt forwarded once: the same (hidden [N,L,C],
    targets [N,L], mask [N,L]), in the order of `pairs`.

    Always two forwards, whatever the prompts (under FSDP every rank must run the same
    collectives): the distinct prompts right-padded, then every completion, each attending to
    its own prompt's cached keys and values; the mask hides the other prompts' padding.
    """
    from transformers import DynamicCache

    if any(len(p) == 0 for p, _ in pairs):
        raise ValueError("every prompt needs at least one token")
    device = lm.device
    prompts, owner = distinct_prompts(pairs)
    owner_t = torch.tensor(owner, device=device)
    prompt_ids_t, prompt_mask = pad_right(prompts, lm.pad_id)
    cache = DynamicCache(config=lm.module.config)
    # Right padding after a prompt's real tokens changes none of them (causal attention).
    prompt_hidden = lm.final_hidden(prompt_ids_t.to(device), None, None, cache)
    plen = torch.tensor([len(p) for p in prompts], device=device)
    # The prompt's last position predicts its completions' first token.
    first = prompt_hidden[torch.arange(len(prompts), device=device), plen - 1][owner_t][:, None]
    # Every completion token but the last predicts the next; the last predicts nothing the
    # loss needs. At least one column, so the second forward always runs.
    tails, tail_mask = pad_right([list(c[:-1]) for _, c in pairs], lm.pad_id)
    if tails.shape[1] == 0:
        tails = torch.full((len(pairs), 1), lm.pad_id, dtype=torch.long)
        tail_mask = torch.zeros((len(pairs), 1), dtype=torch.long)
    cache.batch_select_indices(owner_t)
    seen = torch.cat([prompt_mask.to(device)[owner_t], tail_mask.to(device)], dim=1)
    positions = plen[owner_t][:, None] + torch.arange(tails.shape[1], device=device)[None]
    rest = lm.final_hidden(tails.to(device), seen, positions, cache)
    width = max((len(c) for _, c in pairs), default=0)
    hidden = torch.cat([first, rest], dim=1)[:, :width]
    targets, mask = pad_right([list(c) for _, c in pairs], 0)
    return hidden, targets.to(device), mask.bool().to(device)


def forward_completions_shared(
    lm: CausalLM, pairs: Sequence[PromptCompletion]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`forward_completions` with shared prompts: the same (logits, hidden, targets, mask)."""
    hidden, targets, mask = completion_hidden_shared(lm, pairs)
    return lm.head_logits(hidden), hidden, targets, mask
