"""reasoning-gym's procedural datasets as an environment (the `reasoning-gym` extra).

reasoning-gym (PyPI `reasoning-gym`, offline, no network in its code) builds each item from
`Random(seed + index)`, so a task is a pure function of (dataset, config, seed, index): exactly
what a validator needs to re-derive it. Train and held-out tasks are disjoint index ranges of one
dataset (`[0, size)` and `[size, 2 * size)`), so no held-out item is an item trained on. The
reward is the dataset's own `score_answer` on the answer the completion gives.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

from prime_swarm.libs.environments.base import Env, Task
from prime_swarm.protocol.messages import ChatMessage

DEFAULT_SYSTEM = "Reply with only the final answer, inside <answer></answer> tags."
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class ReasoningGymEnv(Env):
    name = "reasoning-gym"

    def __init__(
        self,
        dataset: str,
        config: dict[str, Any] | None = None,
        seed: int = 0,
        size: int = 1_000_000,
        system_prompt: str | None = DEFAULT_SYSTEM,
        max_answer_chars: int = 64,
    ) -> None:
        try:
            import reasoning_gym
        except ImportError as exc:
            raise ImportError(
                "reasoning-gym is not installed: pip install 'prime-swarm[reasoning-gym]'"
            ) from exc
        if not 1 <= size <= 2**31:
            raise ValueError("size must be 1..2**31")
        self.dataset_name, self.size, self.system_prompt = dataset, size, system_prompt
        self.max_answer_chars = max_answer_chars
        # Both splits in one dataset: `size` train items, then `size` held-out ones.
        self._data = reasoning_gym.create_dataset(
            dataset, **{**(config or {}), "seed": seed, "size": 2 * size}
        )

    def _entry(self, task_id: str) -> dict[str, Any]:
        split, index = self.parse_task_id(task_id)
        return self._data[index % self.size + (self.size if split == "heldout" else 0)]

    def task_from_id(self, task_id: str) -> Task:
        entry = self._entry(task_id)
        messages = [ChatMessage(role="user", content=entry["question"])]
        if self.system_prompt:
            messages.insert(0, ChatMessage(role="system", content=self.system_prompt))
        return Task(task_id=task_id, prompt=messages, answer=str(entry["answer"]))

    @staticmethod
    def final_answer(completion: str) -> str:
        """The text inside the last <answer> tags, else the whole completion, stripped."""
        found = ANSWER.findall(completion)
        return (found[-1] if found else completion).strip()

    def reward(self, task: Task, completion: str) -> float:
        score = self._data.score_answer(self.final_answer(completion), self._entry(task.task_id))
        return min(max(float(score), 0.0), 1.0)

    def format_score(self, task: Task, turns: Sequence[str]) -> float | None:
        """1 when the last turn gives its answer inside the <answer> tags the prompt asks for."""
        if self.system_prompt is None or "<answer>" not in self.system_prompt:
            return None
        return 1.0 if ANSWER.search(turns[-1]) else 0.0

    def noisy_answer(self, task: Task, rng: random.Random, error_rate: float) -> str:
        return f"<answer>{task.answer}</answer>"
