"""GRPO over verified rollouts: the step's configuration, its plan (advantages per group, the
token denominator), its micro-batches (each at most `micro_batch_tokens` tokens) and each one's
loss. step.py puts them together into the one optimizer step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.forward import (
    PromptCompletion,
    RowPacker,
    forward_completions,
    forward_completions_packed,
    forward_completions_shared,
)
from prime_swarm.libs.model.logprobs import scale_logits, token_logprobs
from prime_swarm.libs.rl.advantages import group_advantages
from prime_swarm.libs.rl.defaults import RL
from prime_swarm.libs.rl.loss import LossConfig, grpo_loss, token_entropy
from prime_swarm.protocol.messages import sampled_mask

Layout = Literal["padded", "packed", "shared_prompt"]


@dataclass
class Rollout:
    prompt_ids: list[int]
    completion_ids: list[int]
    # The generating policy version under the trainer's kind of forward (the validator's
    # recomputation), one per token: the PPO ratio's denominator.
    old_logprobs: list[float]
    reward: float
    # The lease's temperature: the ratio compares the same tempered distributions it sampled.
    temperature: float = 1.0
    # What the worker's engine reported while sampling; None when it reported nothing.
    inference_logprobs: list[float] | None = None
    # [start, end) of each model turn in completion_ids: the loss covers these tokens only (the
    # environment's replies between turns are context). None: one turn, every token.
    sampled_spans: list[list[int]] | None = None

    def sampled(self) -> list[bool]:
        n = len(self.completion_ids)
        return sampled_mask(self.sampled_spans or [[0, n]], n)


# All rollouts of a group answer the same prompt; advantages are computed within a group.
RolloutGroup = Sequence[Rollout]


class GRPOConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    loss: LossConfig = Field(default_factory=LossConfig, description="The token loss.")
    max_grad_norm: float = Field(RL.max_grad_norm, gt=0, description="Gradient clipping norm.")
    micro_batch_tokens: int = Field(
        8192,
        ge=1,
        description="Padded tokens per forward/backward; a step accumulates as many micro-batches "
        "as it needs, so the step's batch size is not bounded by activation memory.",
    )
    layout: Layout = Field(
        "shared_prompt",
        description="How a micro-batch's sequences meet the model. padded: each alone, padded "
        "to the longest. packed: several end to end per row (position ids restart per "
        "sequence, a block-diagonal causal mask keeps them apart; a tiny-model step: 1.3-2.8x "
        "faster than padded). shared_prompt: each distinct prompt run once and its keys and "
        "values shared by its completions through the KV cache (a GRPO group of SmolLM2 on "
        "addition: 2.2x faster than packed). The same gradients up to float order.",
    )


@dataclass
class Item:
    rollout: Rollout
    advantage: float


@dataclass
class StepPlan:
    items: list[Item]
    denominator: float
    stats: dict[str, float] = field(default_factory=dict)


def make_optimizer(model: CausalLM, lr: float = RL.lr) -> torch.optim.Optimizer:
    """The optimizer the defaults were tuned with (AdamW, no weight decay)."""
    return torch.optim.AdamW(model.module.parameters(), lr=lr, weight_decay=0.0)


def make_scheduler(
    optimizer: torch.optim.Optimizer, warmup_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over `warmup_steps`, then constant (RL steps are few and noisy: no decay)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: min(1.0, (k + 1) / warmup_steps) if warmup_steps else 1.0
    )


def plan_step(
    batch: Sequence[RolloutGroup], cfg: GRPOConfig, constant_tokens: int | None = None
) -> StepPlan:
    """Advantages per group; rollouts with zero advantage are left out of the forward (they add
    no gradient) but their tokens stay in the 'tokens' denominator: the step's loss is the mean
    over every sampled token of the batch, as TRL's and DAPO's token mean is. Dropping them from
    the denominator too made a step with one informative group in eight push as hard as one
    with eight (SmolLM2 on addition, filter off: gradient norms of 3-6, every step clipped to
    1, against TRL's ~0.5-1). `constant_tokens` is the denominator of the 'constant'
    normalization (the step's token capacity)."""
    items: list[Item] = []
    for group in batch:
        for r in group:
            n = len(r.completion_ids)
            if len(r.old_logprobs) != n or (
                r.inference_logprobs is not None and len(r.inference_logprobs) != n
            ):
                raise ValueError("log-probs must have one entry per completion token")
        adv = group_advantages([r.reward for r in group], cfg.loss.adv_eps, cfg.loss.std_normalize)
        items += [Item(r, float(a)) for r, a in zip(group, adv, strict=True) if a != 0.0]
    tokens = sum(sum(r.sampled()) for group in batch for r in group)
    if cfg.loss.normalize == "constant":
        if not constant_tokens:
            raise ValueError("constant normalization needs the step's token capacity")
        denominator = float(constant_tokens)
    else:
        denominator = float(max(tokens, 1))
    rewards = [r.reward for g in batch for r in g]
    stats = {
        "reward_mean": sum(rewards) / max(len(rewards), 1),
        "groups": float(len(batch)),
        "rollouts_used": float(len(items)),
    }
    return StepPlan(items, denominator, stats)


# What a micro-batch's forward returns: (logits, hidden, targets, mask), [N, L, ...] per pair.
Forward = Callable[
    [CausalLM, Sequence[PromptCompletion]],
    tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
]


def item_tokens(item: Item) -> int:
    """Prompt plus completion: the tokens the item's forward runs over."""
    return len(item.rollout.prompt_ids) + len(item.rollout.completion_ids)


def micro_batches(items: Sequence[Item], budget_tokens: int) -> list[list[Item]]:
    """Items sorted by length (little padding), cut so each padded batch fits the budget."""
    ordered = sorted(items, key=item_tokens)
    out: list[list[Item]] = []
    current: list[Item] = []
    for item in ordered:
        width = item_tokens(item)
        if current and width * (len(current) + 1) > budget_tokens:
            out.append(current)
            current = []
        current.append(item)
    if current:
        out.append(current)
    return out


def packed_micro_batches(items: Sequence[Item], budget_tokens: int) -> list[list[Item]]:
    """Items longest first, cut so each micro-batch's packed rows (as wide as its longest
    sequence, filled first-fit as `forward_completions_packed` fills them) hold at most
    `budget_tokens` tokens, padding included."""
    out: list[list[Item]] = []
    current: list[Item] = []
    packer = RowPacker(0)
    for item in sorted(items, key=item_tokens, reverse=True):
        n = item_tokens(item)
        rows = len(packer.rows) + (packer.slot(n) is None)
        if current and rows * packer.width > budget_tokens:
            out.append(current)
            current = []
        if not current:
            packer = RowPacker(n)
        packer.add(len(current), n)
        current.append(item)
    if current:
        out.append(current)
    return out


def shared_prompt_micro_batches(items: Sequence[Item], budget_tokens: int) -> list[list[Item]]:
    """Items grouped by prompt (a group's completions stay together, so its prompt is run once),
    cut so each micro-batch's distinct prompts plus its padded completions fit the budget."""
    ordered = sorted(
        items, key=lambda i: (tuple(i.rollout.prompt_ids), len(i.rollout.completion_ids))
    )
    out: list[list[Item]] = []
    current: list[Item] = []
    prompts: set[tuple[int, ...]] = set()
    prompt_tokens = widest = 0
    for item in ordered:
        prompt = tuple(item.rollout.prompt_ids)
        new_prompt = 0 if prompt in prompts else len(prompt)
        wide = max(widest, len(item.rollout.completion_ids))
        if current and prompt_tokens + new_prompt + wide * (len(current) + 1) > budget_tokens:
            out.append(current)
            current, prompts, prompt_tokens, wide = [], set(), 0, len(item.rollout.completion_ids)
            new_prompt = len(prompt)
        current.append(item)
        prompts.add(prompt)
        prompt_tokens += new_prompt
        widest = wide
    if current:
        out.append(current)
    return out


_SPLITS = {
    "padded": micro_batches,
    "packed": packed_micro_batches,
    "shared_prompt": shared_prompt_micro_batches,
}
_FORWARDS: dict[str, Forward] = {
    "padded": forward_completions,
    "packed": forward_completions_packed,
    "shared_prompt": forward_completions_shared,
}


def split_micro_batches(items: Sequence[Item], cfg: GRPOConfig) -> list[list[Item]]:
    """The step's micro-batches as `cfg.layout` lays them out."""
    return _SPLITS[cfg.layout](items, cfg.micro_batch_tokens)


def completion_forward(cfg: GRPOConfig) -> Forward:
    """The forward `cfg.layout` asks for (every layout gives the same outputs)."""
    return _FORWARDS[cfg.layout]


def _column(values: Sequence[Sequence[float]], like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(like)
    for i, v in enumerate(values):
        out[i, : len(v)] = torch.tensor(v, dtype=like.dtype)
    return out


def micro_batch_loss(
    model: CausalLM,
    mb: Sequence[Item],
    denominator: float,
    cfg: GRPOConfig,
    ref_model: CausalLM | None = None,
    forward: Forward | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """One micro-batch's share of the step loss (divided by the whole step's denominator) and
    its stats, not yet backpropagated. `forward` defaults to `completion_forward(cfg)`."""
    forward = forward or completion_forward(cfg)
    rollouts = [i.rollout for i in mb]
    pairs = [(r.prompt_ids, r.completion_ids) for r in rollouts]
    logits, _, targets, mask = forward(model, pairs)
    sampled = torch.zeros_like(mask)
    for i, r in enumerate(rollouts):
        row = r.sampled()
        sampled[i, : len(row)] = torch.tensor(row, dtype=mask.dtype)
    mask = mask & sampled
    temps = torch.tensor([r.temperature for r in rollouts], device=logits.device)
    logprobs = token_logprobs(logits, targets, temps[:, None])
    old = _column([r.old_logprobs for r in rollouts], logprobs)
    inference = None
    if all(r.inference_logprobs is not None for r in rollouts):
        inference = _column([r.inference_logprobs or [] for r in rollouts], logprobs)
    ref = None
    if ref_model is not None and cfg.loss.kl_coef > 0:
        with torch.no_grad():
            ref_logits, _, _, _ = forward(ref_model, pairs)
            ref = token_logprobs(ref_logits, targets, temps[:, None])
    entropy = None
    if cfg.loss.entropy_coef > 0:
        entropy = token_entropy(scale_logits(logits, temps[:, None]))
    advantages = torch.tensor([i.advantage for i in mb], device=logprobs.device)
    return grpo_loss(
        logprobs,
        old,
        advantages,
        mask,
        cfg.loss,
        inference_logprobs=inference,
        ref_logprobs=ref,
        entropy=entropy,
        denominator=denominator,
    )
