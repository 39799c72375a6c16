"""A deterministic multi-turn environment for tests on the untrained tiny model, which rarely
writes anything a real game would answer: it replies to every turn, for `TURNS` turns, with the
turn count and the length of the model's last turn (so its replies depend on what was said).
`registered` makes it loadable by name (`load_env`) the way an installed plugin is."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest

from prime_swarm.libs.environments import registry
from prime_swarm.libs.environments.base import Env, Task

TURNS = 3


class EchoCount(Env):
    name = "echo-count"
    max_answer_chars = 8
    max_turns = TURNS

    def task_from_id(self, task_id: str) -> Task:
        return Task(task_id=task_id, prompt="count:", answer="")

    def reward(self, task: Task, completion: str) -> float:
        return 0.0

    def reply(self, task: Task, turns: Sequence[str]) -> str | None:
        return f"<{len(turns)}:{len(turns[-1])}>"

    def score(self, task: Task, turns: Sequence[str]) -> float:
        return len(turns) / TURNS

    def noisy_answer(self, task: Task, rng: random.Random, error_rate: float) -> str:
        return ""


@contextmanager
def registered(env: Env) -> Iterator[Env]:
    """`env` is what `load_env(env.name)` returns inside the block (no arguments)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(registry._INSTANCES, (env.name, registry.args_key(None)), env)
        yield env
