"""Trainer settings: environment variables prefixed PRIME_TRAINER_."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from prime_swarm.libs.observability.logs import LogLevel
from prime_swarm.libs.rl.defaults import RL
from prime_swarm.libs.rl.grpo import GRPOConfig, Layout
from prime_swarm.libs.rl.loss import LossConfig
from prime_swarm.libs.rollout.recipe import Recipe


class TrainerSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="PRIME_TRAINER_", extra="ignore", env_nested_delimiter="__"
    )

    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis with the streams.")
    origin_url: str = Field(..., description="SHARDCAST origin that receives each version.")
    key_file: Path = Field(..., description="Trainer key file; its address signs manifests.")
    init_model_dir: Path = Field(..., description="HF-format model RL starts from (v0).")
    checkpoint_dir: Path = Field(..., description="Where each version is saved as safetensors.")
    progress_file: Path | None = Field(None, description="JSONL file with one line per step.")
    max_steps: int = Field(RL.steps, ge=1, description="Optimizer steps before the trainer exits.")
    groups_per_step: int = Field(
        RL.prompts_per_step, ge=1, description="Rollout groups (prompts) per step."
    )
    recipe: Recipe = Field(
        default_factory=Recipe, description="The pool's recipe (PRIME_RECIPE_* variables)."
    )
    lr: float = Field(RL.lr, gt=0, description="AdamW learning rate.")
    warmup_steps: int = Field(0, ge=0, description="Linear learning-rate warm-up steps.")
    loss: LossConfig = Field(
        default_factory=LossConfig,
        description="The token loss (PRIME_TRAINER_LOSS__EPS_HIGH=0.28 and so on).",
    )
    max_grad_norm: float = Field(RL.max_grad_norm, gt=0, description="Gradient clipping norm.")
    micro_batch_tokens: int = Field(
        8192, ge=1, description="Padded tokens per forward/backward (gradient accumulation)."
    )
    layout: Layout = Field(
        "shared_prompt",
        description="How a micro-batch meets the model: shared_prompt (each distinct prompt "
        "run once, its completions reach it through the KV cache), packed or padded; the same "
        "gradients.",
    )
    filter_zero_variance: bool = Field(
        True,
        description="Drop groups whose completions all scored alike (no gradient) and refill "
        "the batch from the stream.",
    )
    max_filtered_per_step: int = Field(
        256,
        ge=0,
        description="Past this many dropped groups in one step, train on what is there: a "
        "solved task set must not stall the trainer forever.",
    )
    shard_size: int = Field(1 << 20, gt=0, description="SHARDCAST shard size in bytes.")
    publish_precision: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="Precision of the weights shipped to workers and validators (the master "
        "weights and their checkpoint stay fp32). bf16 halves every transfer and lets a small "
        "step ship as a delta (most bf16 values do not move), for pools whose workers compute "
        "in bf16 anyway; the validators then judge against the weights actually shipped.",
    )
    keep_checkpoints: int = Field(4, ge=1, description="Local versions kept on disk.")
    consumer: str = Field("trainer-0", description="Consumer name in the trainer group.")
    reclaim_idle_ms: int = Field(30_000, description="Reclaim entries idle this long.")
    http_timeout_s: float = Field(30.0, gt=0, description="Timeout of each upload request.")
    metrics_host: str = Field("127.0.0.1", description="Interface for /healthz and /metrics.")
    metrics_port: int = Field(0, description="Port for /healthz and /metrics (0: disabled).")
    threads: int = Field(1, ge=1, description="torch intra-op threads.")
    dist_init_method: str | None = Field(
        None,
        description="Rendezvous of a multi-process (FSDP2) trainer: None takes torchrun's; "
        "file:///shared/path uses a file instead of a TCP store.",
    )
    seed: int = Field(0, description="torch seed.")
    log_level: LogLevel = Field("INFO", description="Log level.")

    @property
    def grpo(self) -> GRPOConfig:
        return GRPOConfig(
            loss=self.loss,
            max_grad_norm=self.max_grad_norm,
            micro_batch_tokens=self.micro_batch_tokens,
            layout=self.layout,
        )

    @property
    def step_tokens(self) -> int:
        """A step's completion-token capacity: the 'constant' loss normalization's divisor."""
        return self.groups_per_step * self.recipe.group_size * self.recipe.max_new_tokens
