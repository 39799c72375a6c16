"""The one place for the trainer's tuned numbers (measured with `python -m bench.rl`).

What every service must agree on (group size, temperature, token cap, async level) is the pool's
recipe, libs/rollout/recipe.py; these numbers only shape the warm start and the optimizer.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class WarmStartConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    env: str = Field("reverse", description="Registered env whose train split gives demos.")
    env_args: dict[str, Any] = Field(default_factory=dict, description="The env's arguments.")
    mixture: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Several envs ({env, args, weight} each, as the recipe's mixture): each "
        "demonstration's env is drawn by weight. Empty: `env` alone.",
    )
    steps: int = Field(400, ge=0, description="SFT optimizer steps.")
    batch_size: int = Field(64, ge=1, description="Demonstrations per SFT step.")
    lr: float = Field(3e-3, description="Peak AdamW learning rate for SFT (cosine decay).")
    error_rate: float = Field(
        0.6,
        ge=0.0,
        le=1.0,
        description="Probability that each demo character carries the env's systematic "
        "mistake. Above 0.5 the mistake is the greedy choice, leaving headroom for RL.",
    )


class RLConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    prompts_per_step: int = Field(16, description="Groups consumed by one trainer step.")
    lr: float = Field(5e-4, description="AdamW learning rate for GRPO.")
    max_grad_norm: float = Field(1.0, description="Gradient clipping norm.")
    steps: int = Field(35, description="Trainer steps in the local run.")
    eval_tasks: int = Field(200, description="Held-out tasks per evaluation (greedy).")


WARM_START = WarmStartConfig()
RL = RLConfig()
