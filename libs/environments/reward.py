"""A completion's reward: the environment's task score plus the thinking-budget length part
(plus, where the recipe weighs it, the environment's format part).

INTELLECT-2 puts "Think for N tokens" in the prompt and subtracts coef·|L - N|; L1 (Aggarwal &
Welleck, 2025) only punishes overruns or scales a correct answer by how well it kept the budget.
The three are the `exact`, `max` and `clip` modes below. The worker claims only the task part (it
needs no pool settings); the validator recomputes both parts and the trainer sees them apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from prime_swarm.libs.environments.base import hash_int
from prime_swarm.protocol.messages import Prompt


class LengthReward(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    budgets: list[int] = Field(
        default_factory=list,
        description="Thinking budgets (tokens) a lease may name, one drawn per lease; empty "
        "turns the length reward off and leaves prompts as the environment wrote them.",
    )
    mode: Literal["exact", "max", "clip"] = Field(
        "exact",
        description="exact: -coef·|L-N|; max: -coef·max(0, L-N); clip: the task score times "
        "clip(coef·(N-L) + clip_offset, 0, 1), minus the task score.",
    )
    coef: float = Field(0.0003, ge=0, description="Reward per token off budget (INTELLECT-2).")
    clip_offset: float = Field(0.5, ge=0, le=1, description="δ of the clip mode (L1-Max).")
    prompt: str = Field(
        "Think for {n} tokens. ", description="Prefix naming the budget; {n} is the budget."
    )


@dataclass(frozen=True)
class RewardParts:
    task: float
    length: float = 0.0
    format: float = 0.0
    """The recipe's `format_reward` times the environment's format score."""

    @property
    def total(self) -> float:
        return self.task + self.length + self.format


def length_part(task_score: float, n_tokens: int, target: int | None, cfg: LengthReward) -> float:
    if target is None:
        return 0.0
    if cfg.mode == "exact":
        return -cfg.coef * abs(n_tokens - target)
    if cfg.mode == "max":
        return -cfg.coef * max(0, n_tokens - target)
    scale = min(1.0, max(0.0, cfg.coef * (target - n_tokens) + cfg.clip_offset))
    return task_score * scale - task_score


def score(
    task_score: float,
    n_tokens: int,
    target: int | None,
    cfg: LengthReward,
    format_score: float | None = None,
    format_weight: float = 0.0,
) -> RewardParts:
    """The reward's parts: the task score, the thinking-budget part and, where the recipe
    weighs it and the environment asks for a format, the format part."""
    fmt = format_weight * format_score if format_score is not None else 0.0
    return RewardParts(task_score, length_part(task_score, n_tokens, target, cfg), fmt)


def budget_for(lease_index: int, cfg: LengthReward) -> int | None:
    """The budget of the lease-th task of the pool: a pure function, like the task itself."""
    if not cfg.budgets:
        return None
    return cfg.budgets[hash_int("budget", lease_index) % len(cfg.budgets)]


def with_budget(prompt: Prompt, target: int | None, cfg: LengthReward) -> Prompt:
    """`prompt` with the thinking budget named in front of it (of its last user message)."""
    if target is None:
        return prompt
    note = cfg.prompt.format(n=target)
    if isinstance(prompt, str):
        return note + prompt
    last = max((i for i, m in enumerate(prompt) if m.role == "user"), default=len(prompt) - 1)
    return [
        m.model_copy(update={"content": note + m.content}) if i == last else m
        for i, m in enumerate(prompt)
    ]
