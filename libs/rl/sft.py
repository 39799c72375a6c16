"""The supervised step and loop: cross-entropy on given token sequences, the trainer's half of
the warm start.

Which sequences, and which of their tokens the loss covers, is the caller's: the warm start
(`libs/warmstart`) feeds the environment's noisy-teacher demonstrations from
`libs/rollout/demonstrations.py`, so this module knows no environment or episode.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.forward import forward_completions

Example = tuple[Sequence[int], Sequence[int], Sequence[bool]]
"""(prompt ids, completion ids, per completion token: does the loss cover it)."""
Batches = Callable[[int], Sequence[Example]]
"""Step k's examples, asked for once per step, in order."""
Progress = Callable[[int, int, float], None]
"""(step, total steps, loss) after each logged SFT step."""


def _lr_factor(step: int, total: int, warmup: int = 20, floor: float = 0.1) -> float:
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(step, total) / max(total, 1)))
    return min(1.0, (step + 1) / warmup) * (floor + (1.0 - floor) * cosine)


def train_sft(
    model: CausalLM,
    batches: Batches,
    *,
    steps: int,
    lr: float,
    progress: Progress | None = None,
) -> list[float]:
    """`steps` AdamW steps of cross-entropy on the covered completion tokens of each step's
    examples; returns the loss curve."""
    opt = torch.optim.AdamW(model.module.parameters(), lr=lr, weight_decay=0.0)
    # Cosine decay lets the short run settle into the teacher's mixture on every seed, instead
    # of stopping half-way with some garbled outputs; that keeps the RL starting point uniform.
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: _lr_factor(k, steps))
    losses = []
    model.module.train()
    for step in range(steps):
        examples = batches(step)
        logits, _, targets, mask = forward_completions(model, [(p, c) for p, c, _ in examples])
        # The loss covers what the caller marks (a demonstration's model turns, never the
        # environment's replies between them).
        for i, (_, _, covered) in enumerate(examples):
            mask[i, : len(covered)] &= torch.tensor(list(covered), device=mask.device)
        loss = torch.nn.functional.cross_entropy(logits[mask], targets[mask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.module.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if progress is not None and ((step + 1) % 50 == 0 or step + 1 == steps):
            progress(step + 1, steps, losses[-1])
    model.module.eval()
    return losses
