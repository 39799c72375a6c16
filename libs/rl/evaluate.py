"""Held-out evaluation: mean reward of greedy completions on tasks the policy never trains on."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer

from prime_swarm.libs.model.gpt import TinyGPT
from prime_swarm.libs.model.tokenizer import decode, encode
from prime_swarm.libs.rl.envs import Env, Task
from prime_swarm.libs.rl.sampling import Completion, generate_batch


def completion_reward(env: Env, task: Task, tokenizer: Tokenizer, completion: Completion) -> float:
    """The env's reward for generated token ids (specials such as the final EOS are dropped)."""
    return env.reward(task, decode(tokenizer, completion.token_ids))


def rewards_for(
    model: TinyGPT,
    tokenizer: Tokenizer,
    env: Env,
    tasks: Sequence[Task],
    *,
    temperature: float = 0.0,
    seed: int = 0,
    max_new_tokens: int | None = None,
) -> list[float]:
    """One completion per task, all tasks decoded as one batch."""
    if not tasks:
        return []
    prompts = [encode(tokenizer, t.prompt, add_bos=True) for t in tasks]
    groups = generate_batch(
        model,
        prompts,
        [seed + i for i in range(len(tasks))],
        group_size=1,
        max_new_tokens=max_new_tokens or env.max_answer_chars + 1,
        temperature=temperature,
        eos_id=model.config.eos_token_id,
    )
    return [completion_reward(env, t, tokenizer, g[0]) for t, g in zip(tasks, groups, strict=True)]


def heldout_reward(
    model: TinyGPT,
    tokenizer: Tokenizer,
    env: Env,
    n_tasks: int,
    seed: int,
    temperature: float = 0.0,
) -> float:
    """Mean reward over `n_tasks` held-out tasks (greedy by default, so it is noise-free)."""
    tasks = env.sample_tasks(seed, n_tasks, "heldout")
    rewards = rewards_for(model, tokenizer, env, tasks, temperature=temperature, seed=seed)
    return sum(rewards) / max(len(rewards), 1)
