"""Held-out evaluation: mean reward of greedy completions on tasks the policy never trains on."""

from __future__ import annotations

from collections.abc import Sequence

from prime_swarm.libs.environments import Env, Task
from prime_swarm.libs.model.backend import GenerationBackend, make_backend
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.rollout.episode import play_tasks


def rewards_for(
    lm: CausalLM,
    env: Env,
    tasks: Sequence[Task],
    *,
    temperature: float = 0.0,
    seed: int = 0,
    max_new_tokens: int | None = None,
    backend: GenerationBackend | None = None,
) -> list[float]:
    """One episode per task, all tasks played as one batch, turn by turn (fp32 unless a backend
    says), scored by the environment."""
    if not tasks:
        return []
    groups = play_tasks(
        backend or make_backend("hf", precision="fp32"),
        lm,
        env,
        tasks,
        [seed + i for i in range(len(tasks))],
        group_size=1,
        max_new_tokens=max_new_tokens or env.max_answer_chars + 1,
        temperature=temperature,
    )
    return [g[0] for g in groups]


def heldout_reward(
    lm: CausalLM,
    env: Env,
    n_tasks: int,
    seed: int,
    temperature: float = 0.0,
    max_new_tokens: int | None = None,
) -> float:
    """Mean reward over `n_tasks` held-out tasks (greedy by default, so it is noise-free).
    `max_new_tokens`: the pool's cap (a chatty instruct model needs more than the answer's
    length); default, the env's longest answer plus EOS."""
    tasks = env.sample_tasks(seed, n_tasks, "heldout")
    rewards = rewards_for(
        lm, env, tasks, temperature=temperature, seed=seed, max_new_tokens=max_new_tokens
    )
    return sum(rewards) / max(len(rewards), 1)
