"""Trainer settings: environment variables prefixed PRIME_TRAINER_."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from prime_swarm.libs.rl.defaults import RL
from prime_swarm.libs.rollout.recipe import Recipe


class TrainerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PRIME_TRAINER_", extra="ignore")

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
    clip_eps: float = Field(RL.clip_eps, gt=0, description="PPO-style ratio clip of the GRPO loss.")
    max_grad_norm: float = Field(RL.max_grad_norm, gt=0, description="Gradient clipping norm.")
    shard_size: int = Field(1 << 20, gt=0, description="SHARDCAST shard size in bytes.")
    keep_checkpoints: int = Field(4, ge=1, description="Local versions kept on disk.")
    consumer: str = Field("trainer-0", description="Consumer name in the trainer group.")
    reclaim_idle_ms: int = Field(30_000, description="Reclaim entries idle this long.")
    http_timeout_s: float = Field(30.0, gt=0, description="Timeout of each upload request.")
    metrics_host: str = Field("127.0.0.1", description="Interface for /healthz and /metrics.")
    metrics_port: int = Field(0, description="Port for /healthz and /metrics (0: disabled).")
    threads: int = Field(1, ge=1, description="torch intra-op threads.")
    seed: int = Field(0, description="torch seed.")
    log_level: str = Field("INFO", description="Log level.")
