"""The one place for the RL recipe's tuned numbers (measured with bench/rl_offline.py).

Services build their settings on these models, so a change here moves the whole network.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class WarmStartConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    env: str = Field("reverse", description="Registered env whose train split gives demos.")
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

    env: str = Field("reverse", description="Registered env the pool trains on.")
    group_size: int = Field(8, description="Completions sampled per prompt (one GRPO group).")
    prompts_per_step: int = Field(16, description="Groups consumed by one trainer step.")
    temperature: float = Field(1.0, description="Sampling temperature for rollouts.")
    max_new_tokens: int = Field(8, description="Generation cap: longest answer (7) plus EOS.")
    lr: float = Field(5e-4, description="AdamW learning rate for GRPO.")
    clip_eps: float = Field(0.2, description="PPO ratio clipping epsilon.")
    max_grad_norm: float = Field(1.0, description="Gradient clipping norm.")
    steps: int = Field(35, description="Trainer steps in the local run.")
    async_level: int = Field(2, description="Rollouts from policy v are used while v >= step-2.")
    replay_tol: float = Field(
        0.02,
        description="Gumbel replay tolerance on perturbed scores: honest decode and prefill "
        "agree exactly on one device type; the slack covers cross-device kernel noise.",
    )
    eval_tasks: int = Field(200, description="Held-out tasks per evaluation (greedy).")


WARM_START = WarmStartConfig()
RL = RLConfig()
