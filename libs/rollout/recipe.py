"""The pool's recipe: the settings every service must agree on, set once.

Every service reads it from the same `PRIME_RECIPE_*` environment variables (or takes the
launcher's one instance), so the orchestrator's leases, the validator's checks and the trainer's
staleness bound can never drift apart. Settings only one service uses live in that service.
"""

from __future__ import annotations

import json
import math

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from prime_swarm.libs.environments import Env, env_factory, load_env
from prime_swarm.libs.environments.reward import LengthReward
from prime_swarm.libs.rollout.selection import PromptSelection
from prime_swarm.protocol.messages import AcceptedStacks, EnvArgs


def _env_installed(name: str) -> str:
    env_factory(name)
    return name


def _env_builds(args: dict, info: ValidationInfo) -> dict:
    if "env" in info.data:  # else the name's own error is the one to report
        load_env(info.data["env"], args)
    return args


class EnvShare(BaseModel):
    """One environment of a mixture: what it is built with and its share of the leases."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    env: str = Field(description="Installed environment (entry-point name).")
    args: EnvArgs = Field(default_factory=dict, description="Its arguments (JSON).")
    weight: float = Field(1.0, gt=0, le=1e6, description="Relative share of the leases.")

    _installed = field_validator("env")(_env_installed)
    _builds = field_validator("args")(_env_builds)


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
    mixture: list[EnvShare] = Field(
        default_factory=list,
        max_length=32,
        description="Several environments, each with its arguments and a weight "
        '(JSON: [{"env": "addition", "weight": 2}, {"env": "reasoning-gym", "args": {...}}]); '
        "leases are drawn by weight. Empty: the one environment `env` with `env_args`.",
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
    format_reward: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Weight of the environment's format score (e.g. reasoning-gym's answer "
        "inside <answer> tags) added to the task score: a task the model cannot yet answer "
        "still gives groups a signal. The validator recomputes it; 0 turns it off.",
    )
    tool_python: str = Field(
        "3.11",
        pattern=r"^3\.\d{1,2}$",
        description="The Python minor version that model-written and environment code runs "
        "under in every worker's and validator's sandbox: a cell's output depends on it (3.12 "
        "has functions 3.11 lacks), everything below it is masked. A machine whose sandbox "
        "interpreter is another one is refused at join (PRIME_SANDBOX_PYTHON points at one).",
    )
    stacks: AcceptedStacks = Field(
        default_factory=AcceptedStacks,
        description="The worker stacks the pool verifies (JSON of version specifiers: python, "
        'torch, transformers, vllm, env_releases), e.g. {"torch": ">=2.13,<2.15"}; a worker '
        "on another is refused at join, before it stakes.",
    )
    selection: PromptSelection = Field(
        default_factory=PromptSelection,
        description='Live prompt selection by pass rate (JSON, e.g. {"enabled": true}).',
    )

    # A recipe that names an environment that is not installed, does not import or refuses its
    # arguments stops the service that reads it at start, with one line naming the variable.
    _installed = field_validator("env")(_env_installed)
    _builds = field_validator("env_args")(_env_builds)

    @field_validator("mixture")
    @classmethod
    def _one_share_each(cls, shares: list[EnvShare]) -> list[EnvShare]:
        # Task ids, per-environment reports and held-out sets are keyed by the environment's
        # name, so one name may appear once (a dataset mix inside one environment is that
        # environment's own argument, e.g. reasoning-gym's `composite`).
        names = [s.env for s in shares]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"environment {', '.join(map(repr, repeated))} is named twice")
        if not math.isfinite(sum(s.weight for s in shares)):
            raise ValueError("weights must sum to a finite number")
        return shares

    def shares(self) -> list[EnvShare]:
        """The pool's environments with their weights: the mixture, or the one environment."""
        if self.mixture:
            return list(self.mixture)
        return [EnvShare.model_construct(env=self.env, args=self.env_args, weight=1.0)]

    def environments(self) -> dict[str, Env]:
        """Every environment of the pool, built with its arguments, by name."""
        return {s.env: load_env(s.env, s.args) for s in self.shares()}

    def pinned_tool_python(self) -> str | None:
        """`tool_python` when one of the pool's environments runs code, else None (a pool
        without sandboxed code pins no interpreter)."""
        runs_code = any(env.runs_code for env in self.environments().values())
        return self.tool_python if runs_code else None

    def environment(self) -> Env:
        """The pool's environment: the only one, or a mixture's first."""
        first = self.shares()[0]
        return load_env(first.env, first.args)

    def pick(self, draw: int) -> EnvShare:
        """The share a lease's draw (a uniform 48-bit integer) lands in, by weight: a pure
        function, so every replica of the orchestrator picks alike."""
        shares = self.shares()
        total = sum(s.weight for s in shares)
        point = draw / 2**48 * total
        for share in shares:
            point -= share.weight
            if point < 0:
                return share
        return shares[-1]

    def env_vars(self) -> dict[str, str]:
        """This recipe as the environment variables that reproduce it in another process."""
        return {
            f"PRIME_RECIPE_{k.upper()}": v if isinstance(v, str) else json.dumps(v)
            for k, v in self.model_dump().items()
        }
