"""Ranks 1..N-1 of a torchrun trainer: hold their FSDP2 shards and step in lockstep with rank 0,
which alone talks to Redis, checkpoints and publishes (loop.py)."""

from __future__ import annotations

from pathlib import Path

from prime_swarm.libs.model.io import load_pretrained
from prime_swarm.libs.rl.distributed import (
    DistContext,
    broadcast_batch,
    full_optimizer_state_dict,
    full_state_dict,
    load_full_optimizer_state_dict,
    shard_model,
)
from prime_swarm.libs.rl.grpo import make_optimizer, make_scheduler
from prime_swarm.libs.rl.step import train_step

from .settings import TrainerSettings


def follow(settings: TrainerSettings, ctx: DistContext) -> None:
    # The same collectives, in the same order, as Trainer._resume and Trainer.train_step.
    _step, source, scheduler_state = broadcast_batch(None, ctx)
    model = shard_model(load_pretrained(Path(source)), ctx)
    opt = make_optimizer(model, lr=settings.lr)
    sched = make_scheduler(opt, settings.warmup_steps)
    load_full_optimizer_state_dict(model, opt, None, ctx)
    if scheduler_state:
        sched.load_state_dict(scheduler_state)
    cfg = settings.grpo
    while (groups := broadcast_batch(None, ctx)) is not None:
        train_step(
            model, opt, groups, cfg, ctx, scheduler=sched, constant_tokens=settings.step_tokens
        )
        full_optimizer_state_dict(model, opt, ctx)
        full_state_dict(model, ctx)
