"""Run by test_trainer_fsdp.py under torchrun (2 CPU ranks, gloo): train the tiny model with
FSDP2 and compare with single-process `train_step`s of the same batch, on rank 0. Prints one JSON
line (rank 0) with the largest differences found.

Usage: python -m torch.distributed.run --nproc-per-node 2 ... fsdp_probe.py
"""

from __future__ import annotations

import json
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_map_only

from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.forward import forward_completions, pack_rows
from prime_swarm.libs.model.logprobs import token_logprobs
from prime_swarm.libs.model.tokenizer import build_tokenizer
from prime_swarm.libs.rl.distributed import (
    DistContext,
    broadcast_batch,
    close_distributed,
    full_optimizer_state_dict,
    full_state_dict,
    init_distributed,
    load_full_optimizer_state_dict,
    rank_share,
    shard_model,
)
from prime_swarm.libs.rl.grpo import (
    GRPOConfig,
    Item,
    Rollout,
    item_tokens,
    plan_step,
    split_micro_batches,
)
from prime_swarm.libs.rl.loss import LossConfig
from prime_swarm.libs.rl.step import train_step

BOS, EOS = 257, 258
STEPS = 3
LR = 1e-3
# AdamW's update g/(sqrt(v)+eps) turns float noise in gradients near eps into relative noise
# in the update; a larger eps keeps the comparison about the gradients, not that noise.
EPS = 1e-6
STAT_KEYS = ("loss", "tokens", "grad_norm", "clip_frac", "ratio_mean", "ratio_min", "ratio_max")


def _lm() -> CausalLM:
    return CausalLM(init_tiny_model(0), build_tokenizer())


def make_batch() -> list[list[Rollout]]:
    """Four groups with varied lengths; behaviour log-probs a little off the initial policy so
    that ratios leave 1 and clipping takes part."""
    g = torch.Generator().manual_seed(0)
    lm = _lm()
    groups = []
    # The last group is short: its sequences fit beside the others in packed rows.
    for size, longest in ((3, 14), (4, 14), (2, 14), (2, 3)):
        n_prompt = int(torch.randint(1, longest, (1,), generator=g))
        prompt = [BOS, *torch.randint(0, 256, (n_prompt,), generator=g).tolist()]
        group = []
        for j in range(size):
            n = int(torch.randint(1, longest, (1,), generator=g))
            comp = [*torch.randint(0, 256, (n,), generator=g).tolist(), EOS]
            with torch.no_grad():
                logits, _, targets, mask = forward_completions(lm, [(prompt, comp)])
                lp = token_logprobs(logits, targets, 1.0)[0][mask[0]]
            noise = 0.3 * torch.randn(lp.shape, generator=g)
            group.append(Rollout(prompt, comp, (lp + noise).tolist(), float(j * j)))
        groups.append(group)
    return groups


def max_diff(a: Any, b: Any) -> float:
    """Largest |a - b| over two (nested) state dicts of the same structure."""
    if isinstance(a, dict):
        if a.keys() != b.keys():
            raise AssertionError(f"keys differ: {sorted(a.keys() ^ b.keys())[:5]}")
        return max((max_diff(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, list | tuple):
        assert len(a) == len(b)
        return max((max_diff(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    if isinstance(a, torch.Tensor):
        return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
    if a != b:
        raise AssertionError(f"{a!r} != {b!r}")
    return 0.0


def _widths(mb: list[Item]) -> list[int]:
    return [item_tokens(i) for i in mb]


def _adamw(lm: CausalLM) -> torch.optim.Optimizer:
    return torch.optim.AdamW(lm.module.parameters(), lr=LR, eps=EPS, weight_decay=0.0)


def _grads(lm: CausalLM) -> dict[str, torch.Tensor]:
    # full_tensor() all-gathers a sharded gradient: every rank must call it.
    return {
        n: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad.clone()
        for n, p in lm.module.named_parameters()
    }


def variant(ctx: DistContext, batch: list[list[Rollout]], cfg: GRPOConfig) -> dict[str, Any]:
    lm = shard_model(_lm(), ctx)
    opt = _adamw(lm)
    dist_stats, grads = [], {}
    for step in range(STEPS):
        dist_stats.append(train_step(lm, opt, batch, cfg, ctx))
        if step == 0:
            grads = _grads(lm)
    weights = full_state_dict(lm, ctx)
    optim = full_optimizer_state_dict(lm, opt, ctx)
    # What the checkpoint holds now: training on (and loading from) it must not change it.
    snapshot = tree_map_only(torch.Tensor, torch.clone, (weights, optim))

    # Resume: a fresh sharded model and optimizer loaded from the full state dicts must step
    # exactly as the original does. As the trainer resumes (services/trainer/loop.py), every
    # rank holds the saved weights before it shards, and the optimizer's state comes after.
    plain = _lm()
    plain.module.load_state_dict(broadcast_batch(weights, ctx))
    resumed = shard_model(plain, ctx)
    opt2 = _adamw(resumed)
    load_full_optimizer_state_dict(resumed, opt2, optim, ctx)
    train_step(lm, opt, batch, cfg, ctx)
    train_step(resumed, opt2, batch, cfg, ctx)
    after, after_resumed = full_state_dict(lm, ctx), full_state_dict(resumed, ctx)

    items = plan_step(batch, cfg).items
    shares = [rank_share(items, r, ctx.world_size) for r in range(ctx.world_size)]
    mbs = [mb for share in shares for mb in split_micro_batches(share, cfg)]
    if not ctx.is_main:
        return {}
    assert weights is not None and optim is not None
    assert after is not None and after_resumed is not None

    ref = _lm()
    ref_opt = _adamw(ref)
    ref_stats, ref_grads = [], {}
    for step in range(STEPS):
        ref_stats.append(train_step(ref, ref_opt, batch, cfg))
        if step == 0:
            ref_grads = _grads(ref)
    single = DistContext(0, 1, torch.device("cpu"))
    ref_weights = full_state_dict(ref, single)
    ref_optim = full_optimizer_state_dict(ref, ref_opt, single)
    return {
        "checkpoint_changed": max_diff((weights, optim), snapshot),
        "grads_diff": max_diff(grads, ref_grads),
        "weights_diff": max_diff(weights, ref_weights),
        "weights_moved": max_diff(weights, _lm().module.state_dict()),
        "optim_diff": max_diff(optim, ref_optim),
        "optim_step": float(optim["state"]["lm_head.weight"]["step"]),
        "resume_diff": max_diff(after, after_resumed),
        "resume_moved": max_diff(after, weights),
        "stats_diff": max(
            abs(d[k] - r[k]) for d, r in zip(dist_stats, ref_stats, strict=True) for k in STAT_KEYS
        ),
        "clip_frac": ref_stats[-1]["clip_frac"],
        "micro_batches_per_rank": [len(split_micro_batches(share, cfg)) for share in shares],
        "rounds": dist_stats[0]["micro_batches"],
        # Sequences that shared a row with another (when packing): rows saved by packing.
        "rows_saved": (
            sum(len(mb) - len(pack_rows(_widths(mb), max(_widths(mb)))) for mb in mbs)
            if cfg.layout == "packed"
            else 0
        ),
    }


def main() -> None:
    ctx = init_distributed(timeout_s=60)
    assert ctx.distributed and ctx.world_size == 2, ctx
    torch.set_num_threads(1)
    batch = broadcast_batch(make_batch() if ctx.is_main else None, ctx)
    # Budgets small enough for gradient accumulation, and for the two ranks to need different
    # numbers of micro-batches (the shorter share runs a zero-loss filler).
    # Classic PPO (ratio to the generating version), so that clipping takes part.
    ppo = LossConfig(ratio_against="generator")
    result = {
        name: variant(ctx, batch, GRPOConfig(micro_batch_tokens=budget, layout=name, loss=ppo))
        for name, budget in (("padded", 40), ("packed", 30), ("shared_prompt", 30))
    }
    close_distributed(ctx, finished=True)
    if ctx.is_main:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
