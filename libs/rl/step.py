"""The one GRPO optimizer step: the trainer service, its FSDP followers and every bench call it.

Every rank plans the whole (broadcast) batch, so advantages and the token denominator are global
without a collective; each rank then forwards and backwards its own share of the rollouts (in a
single process: all of them).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed.tensor import DTensor

from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.rl.distributed import (
    DistContext,
    all_reduce_stats,
    max_over_ranks,
    rank_share,
    sharded_forward,
)
from prime_swarm.libs.rl.grpo import (
    GRPOConfig,
    RolloutGroup,
    completion_forward,
    item_tokens,
    micro_batch_loss,
    plan_step,
    split_micro_batches,
)
from prime_swarm.libs.rl.loss import merge_stats


def train_step(
    model: CausalLM,
    optimizer: torch.optim.Optimizer,
    batch: Sequence[RolloutGroup],
    cfg: GRPOConfig | None = None,
    ctx: DistContext | None = None,
    *,
    ref_model: CausalLM | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    constant_tokens: int | None = None,
) -> dict[str, float]:
    """Plan, accumulate every micro-batch's gradient, clip, step: the one optimizer step, in one
    process or (with `ctx` from torchrun) on every rank with the same `batch` (see
    `broadcast_batch`); every rank returns the step's merged stats. With nothing to learn from
    (every group zero-variance) the weights stay as they are and the version still advances.

    Every rank runs the same number of micro-batches, because FSDP's forward and backward are
    collectives: a rank whose share needs fewer repeats the step's shortest item with a zero
    loss. The stats add `micro_batches`, the forward/backward passes each rank ran.
    """
    cfg = cfg or GRPOConfig()
    ctx = ctx or DistContext(0, 1, model.device)
    # The whole batch on every rank: the denominator (and the advantages) are global as planned.
    plan = plan_step(batch, cfg, constant_tokens)
    stats = {**plan.stats, **merge_stats([], plan.denominator), "grad_norm": 0.0}
    if not plan.items:
        # Every rank sees the same plan, so every rank skips the step together.
        return stats
    mine = split_micro_batches(rank_share(plan.items, ctx.rank, ctx.world_size), cfg)
    rounds = max_over_ranks(len(mine), ctx)
    filler = [min(plan.items, key=item_tokens)]
    forward = sharded_forward(completion_forward(cfg))
    model.module.train()
    optimizer.zero_grad(set_to_none=True)
    parts = []
    for k in range(rounds):
        real = k < len(mine)
        loss, part = micro_batch_loss(
            model, mine[k] if real else filler, plan.denominator, cfg, ref_model, forward
        )
        # The filler's graph is the real thing's (same collectives); times 0 it adds nothing.
        (loss if real else loss * 0.0).backward()
        if real:
            parts.append(part)
    # On sharded (DTensor) gradients clip_grad_norm_ computes the global norm (its partial
    # sums are all-reduced) and returns it as a replicated DTensor.
    grad_norm = torch.nn.utils.clip_grad_norm_(model.module.parameters(), cfg.max_grad_norm)
    if isinstance(grad_norm, DTensor):
        grad_norm = grad_norm.full_tensor()
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    model.module.eval()
    stats.update(
        merge_stats(all_reduce_stats(parts, ctx), plan.denominator),
        grad_norm=float(grad_norm),
        micro_batches=float(rounds),
    )
    return stats
