"""The pool's recipe: the settings every service must agree on, set once.

Every service reads it from the same `PRIME_RECIPE_*` environment variables (or takes the
launcher's one instance), so the orchestrator's leases, the validator's checks and the trainer's
staleness bound can never drift apart. Settings only one service uses live in that service.
"""

from __future__ import annotations

import json

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from prime_swarm.libs.environments import Env, env_factory, load_env
from prime_swarm.libs.environments.reward import LengthReward
from prime_swarm.protocol.messages import EnvArgs


class Recipe(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PRIME_RECIPE_", extra="ignore", frozen=True)

    env: str = Field(
        "reverse",
        description="Installed environment whose tasks are leased (entry-point group "
        "prime_swarm.environments).",
    )
    env_args: EnvArgs = Field(
        default_factory=dict, description="Arguments the environment is built with (JSON)."
    )
    group_size: int = Field(8, ge=1, le=64, description="Completions per leased prompt (a group).")
    temperature: float = Field(1.0, gt=0, le=4, description="Sampling temperature of every lease.")
    max_new_tokens: int = Field(
        8,
        ge=1,
        le=4096,
        description="Generation cap per model turn (longest answer + EOS); a multi-turn "
        "episode's tokens in all are bounded by the model's context.",
    )
    async_level: int = Field(
        2,
        ge=0,
        description="Rollouts of policy v are admitted while v >= trainer step - async_level "
        "(INTELLECT-2's two-step asynchrony).",
    )
    length_reward: LengthReward = Field(
        default_factory=LengthReward,
        description="Thinking budgets in prompts and the length reward (off unless budgets).",
    )

    # A recipe that names an environment that is not installed, does not import or refuses its
    # arguments stops the service that reads it at start, with one line naming the variable.
    @field_validator("env")
    @classmethod
    def _env_installed(cls, name: str) -> str:
        env_factory(name)
        return name

    @field_validator("env_args")
    @classmethod
    def _env_builds(cls, args: dict, info: ValidationInfo) -> dict:
        if "env" in info.data:  # else the name's own error is the one to report
            load_env(info.data["env"], args)
        return args

    def environment(self) -> Env:
        """The environment this recipe names, built with its arguments."""
        return load_env(self.env, self.env_args)

    def env_vars(self) -> dict[str, str]:
        """This recipe as the environment variables that reproduce it in another process."""
        return {
            f"PRIME_RECIPE_{k.upper()}": v if isinstance(v, str) else json.dumps(v)
            for k, v in self.model_dump().items()
        }
