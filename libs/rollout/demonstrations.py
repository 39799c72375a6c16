"""Warm-start demonstrations: an environment's noisy-teacher turns, as the token sequences an
episode would produce.

The environment writes the model's turns (`Env.demonstration`, with its systematic mistake at
`error_rate`); between them sit its replies by the same episode rule the worker plays by
(`episode.next_context`). What comes out is token sequences only, (prompt, completion, which
completion tokens the model said), so the supervised step in `libs/rl/sft.py` trains on them
without knowing environments or episodes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from prime_swarm.libs.environments.base import Env, Task
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.tokenizer import prompt_ids
from prime_swarm.protocol.messages import sampled_mask

from .episode import Limits, next_context

Demonstration = tuple[list[int], list[int], list[bool]]
"""(prompt ids, completion ids, per completion token: did the model say it)."""


def demonstrated(
    env: Env, task: Task, model: CausalLM, prompt: list[int], turns: list[str]
) -> tuple[list[int], list[list[int]]]:
    """A demonstration's tokens after the prompt and its turns' spans: each turn's text then
    EOS, and between turns the environment's reply by the episode rule the worker plays by
    (libs/rollout/episode.py); the demonstration stops where the episode would."""
    tok, eos = model.tokenizer, min(model.eos_ids)
    # Any turn length is allowed: the demonstration's turns are the env's own.
    limits = Limits(max_new_tokens=1, budget=model.context_len - len(prompt))
    completion: list[int] = []
    spans: list[list[int]] = []
    for text in turns:
        start = len(completion)
        completion += [*tok(text, add_special_tokens=False)["input_ids"], eos]
        spans.append([start, len(completion)])
        said = [completion[a:b] for a, b in spans]
        reply = next_context(env, task, tok, model.eos_ids, said, len(completion), limits)
        if reply is None:
            break
        completion += reply
    # A reply after the last demonstrated turn leads nowhere: the branch ends at its EOS.
    return completion[: spans[-1][1]], spans


def demonstration_batches(
    envs: Env | Sequence[tuple[Env, float]],
    model: CausalLM,
    *,
    seed: int,
    batch_size: int,
    error_rate: float,
) -> Callable[[int], list[Demonstration]]:
    """Step k's batch of `batch_size` demonstrations on train tasks, of one environment or of
    a mixture (each row's environment drawn by weight). One random stream over all steps, so
    ask for the steps in order, each once: then the same seed gives the same data."""
    mixture = [(envs, 1.0)] if isinstance(envs, Env) else list(envs)
    rng = random.Random(seed)
    tok = model.tokenizer

    def batch(step: int) -> list[Demonstration]:
        if len(mixture) == 1:
            counts = {0: batch_size}
        else:
            drawn = rng.choices(range(len(mixture)), [w for _, w in mixture], k=batch_size)
            counts = {i: drawn.count(i) for i in range(len(mixture)) if i in drawn}
        rows: list[Demonstration] = []
        for i, n in counts.items():
            env = mixture[i][0]
            for task in env.sample_tasks(seed * 1_000_003 + step, n, "train"):
                prompt = prompt_ids(tok, task.prompt)
                turns = env.demonstration(task, rng, error_rate)
                completion, spans = demonstrated(env, task, model, prompt, turns)
                rows.append((prompt, completion, sampled_mask(spans, len(completion))))
        return rows

    return batch
