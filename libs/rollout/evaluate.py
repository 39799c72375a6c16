"""A policy scored on an environment's tasks by playing them: the held-out evaluation (mean
reward of greedy completions on tasks the policy never trains on) and the offline filter's pass
rates (`libs/environments/task_lists.py` keeps the band and writes the list)."""

from __future__ import annotations

from collections.abc import Sequence

from prime_swarm.libs.environments import Env, Task
from prime_swarm.libs.environments.base import hash_int
from prime_swarm.libs.model.backend import GenerationBackend, make_backend
from prime_swarm.libs.model.causal_lm import CausalLM

from .episode import play_tasks


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
    backend: GenerationBackend | None = None,
) -> float:
    """Mean reward over `n_tasks` held-out tasks (greedy by default, so it is noise-free).
    `max_new_tokens`: the pool's cap (a chatty instruct model needs more than the answer's
    length); default, the env's longest answer plus EOS. `backend`: transformers in fp32
    unless given (a vllm one scores a real model's many checkpoints several times faster)."""
    tasks = env.sample_tasks(seed, n_tasks, "heldout")
    rewards = rewards_for(
        lm,
        env,
        tasks,
        temperature=temperature,
        seed=seed,
        max_new_tokens=max_new_tokens,
        backend=backend,
    )
    return sum(rewards) / max(len(rewards), 1)


def pass_rates(
    lm: CausalLM,
    env: Env,
    task_ids: Sequence[str],
    *,
    samples: int,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    backend: GenerationBackend | None = None,
    batch_prompts: int = 64,
    pass_threshold: float = 1.0,
) -> dict[str, float]:
    """Fraction of `samples` sampled completions per task whose reward reaches `pass_threshold`."""
    if samples < 1:
        raise ValueError("samples must be at least 1")
    if batch_prompts < 1:
        raise ValueError("batch_prompts must be at least 1")
    backend = backend or make_backend("hf", precision="fp32")
    tasks = [env.task_from_id(t) for t in dict.fromkeys(task_ids)]  # dedupe, keep order
    rates: dict[str, float] = {}
    for start in range(0, len(tasks), batch_prompts):
        batch = tasks[start : start + batch_prompts]
        groups = play_tasks(
            backend,
            lm,
            env,
            batch,
            # Seeded by task id, not batch position, so a task's rate does not depend on which
            # other tasks were scored alongside it or on batch_prompts.
            [hash_int("filter", seed, t.task_id, nbytes=7) for t in batch],
            group_size=samples,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
        )
        for task, scores in zip(batch, groups, strict=True):
            rates[task.task_id] = sum(r >= pass_threshold for r in scores) / samples
    return rates
