"""Verifiable RL environments: torch-free plugins found by name (see `registry`).

An environment derives each task from its id alone and scores a completion by rule, the same on
every machine: deterministic given the lease (no wall clock, no network, no judge model), because
a validator re-derives the prompt and recomputes the reward of every rollout it checks.
"""

from prime_swarm.libs.environments.base import SPLITS, Env, Split, Task
from prime_swarm.libs.environments.registry import EnvLoadError, env_factory, installed, load_env

__all__ = [
    "SPLITS",
    "Env",
    "EnvLoadError",
    "Split",
    "Task",
    "env_factory",
    "installed",
    "load_env",
]
