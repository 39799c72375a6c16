"""The pool's task stream: its index-th task, a pure function of (seed, index), so no worker
steers it and every replica of the orchestrator (and a baseline trained on the same data) draws
alike."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prime_swarm.libs.environments import Env, Task
from prime_swarm.libs.environments.base import hash_int
from prime_swarm.libs.rollout.recipe import EnvShare, Recipe


def task_at(
    recipe: Recipe,
    envs: Mapping[str, Env],
    seed: int,
    index: int,
    *,
    train_tasks: int | None = None,
    task_lists: Mapping[str, Sequence[str]] | None = None,
) -> tuple[EnvShare, Task]:
    """The environment is drawn by weight first, then a task of its train split: one of the
    first `train_tasks` (prompts that recur, as in a finite dataset) or of its task list."""
    share = recipe.pick(hash_int("env", seed, index, nbytes=6))
    env = envs[share.env]
    pick = hash_int("lease", seed, index, nbytes=6)
    if train_tasks is not None:
        pick %= train_tasks
    listed = (task_lists or {}).get(share.env)
    task_id = listed[pick % len(listed)] if listed else env.task_id("train", pick)
    return share, env.task_from_id(task_id)
