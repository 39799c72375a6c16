"""Two-number addition asked in words, for an instruct model through its chat template.

"What is 23 + 41? Reply with just the number." The reward is 1.0 when the last integer in the
reply is the sum: an instruct model that answers "23 + 41 = 64." is right, one that stops at
"23 + 41 =" is not. This is the task the issue measured SmolLM2-135M-Instruct and TRL's
GRPOTrainer on (operands 10..50: greedy accuracy about 0.34 before training), so it is the real
model's task in `prime-swarm up --preset smollm2` and in bench-trainer's `real` section.
"""

from __future__ import annotations

import random
import re

from prime_swarm.libs.environments.base import Env, Split, Task, hash_int
from prime_swarm.protocol.messages import ChatMessage

QUESTION = "What is {a} + {b}? Reply with just the number."
INTEGER = re.compile(r"-?\d+")


class AdditionEnv(Env):
    def __init__(
        self, name: str = "addition", low: int = 10, high: int = 50, heldout_percent: int = 20
    ) -> None:
        """Operands uniform in `low..high` (inclusive). `heldout_percent` of the unordered
        pairs are held out: `a + b` and `b + a` are one problem, in one split."""
        if not 0 <= low <= high <= 10**9:
            raise ValueError(f"need 0 <= low <= high <= 1e9, got low={low} high={high}")
        if not 1 <= heldout_percent <= 50:
            raise ValueError(f"heldout_percent must be 1..50, got {heldout_percent}")
        self.name, self.low, self.high = name, low, high
        self.heldout_percent = heldout_percent
        self.max_answer_chars = len(str(2 * high))

    def split_of(self, a: int, b: int) -> Split:
        a, b = min(a, b), max(a, b)
        held = hash_int(self.name, "split", a, b) % 100 < self.heldout_percent
        return "heldout" if held else "train"

    def _operands(self, split: Split, index: int) -> tuple[int, int]:
        span = self.high - self.low + 1
        # Rejection-sample until the pair falls in the split (~1.25 tries for train at 20 %).
        for attempt in range(10_000):
            h = hash_int(self.name, index, attempt, nbytes=16)
            a, b = self.low + h % span, self.low + (h // span) % span
            if self.split_of(a, b) == split:
                return a, b
        raise RuntimeError(f"no {split} problem in {self.low}..{self.high}")

    def task_from_id(self, task_id: str) -> Task:
        split, index = self.parse_task_id(task_id)
        a, b = self._operands(split, index)
        message = ChatMessage(role="user", content=QUESTION.format(a=a, b=b))
        return Task(task_id=task_id, prompt=[message], answer=str(a + b))

    def reward(self, task: Task, completion: str) -> float:
        found = INTEGER.findall(completion)
        return 1.0 if found and found[-1] == task.answer else 0.0

    def noisy_answer(self, task: Task, rng: random.Random, error_rate: float) -> str:
        # A real model is not warm-started here; an off-by-one sum is the mistake if one is asked.
        return task.answer if rng.random() >= error_rate else str(int(task.answer) + 1)
