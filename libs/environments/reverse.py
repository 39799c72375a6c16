"""String reversal: `rev 4821=` -> `1284`.

Chosen because a 2-layer model can represent it exactly, and partial credit per position gives
GRPO a dense signal within a group of samples.
"""

from __future__ import annotations

import random
import string

from prime_swarm.libs.environments.base import Env, Split, Task, hash_int

HELDOUT_PERCENT = 10


class ReverseEnv(Env):
    def __init__(
        self,
        name: str = "reverse",
        alphabet: str = string.digits,
        min_len: int = 3,
        max_len: int = 7,
    ) -> None:
        self.name = name
        self.alphabet = alphabet
        self.min_len = min_len
        self.max_len = max_len
        self.max_answer_chars = max_len

    def split_of(self, s: str) -> Split:
        # Membership depends on the string itself, so the splits are disjoint by construction.
        return "heldout" if hash_int(self.name, "split", s) % 100 < HELDOUT_PERCENT else "train"

    def _string(self, split: Split, index: int) -> str:
        # Rejection-sample until the string falls in the requested split (~1.1 tries for train).
        for attempt in range(10_000):
            h = hash_int(self.name, index, attempt, nbytes=32)
            length = self.min_len + h % (self.max_len - self.min_len + 1)
            h //= self.max_len - self.min_len + 1
            chars = []
            for _ in range(length):
                h, r = divmod(h, len(self.alphabet))
                chars.append(self.alphabet[r])
            s = "".join(chars)
            if self.split_of(s) == split:
                return s
        raise RuntimeError("no string found for the split")  # unreachable in practice

    def task_from_id(self, task_id: str) -> Task:
        split, index = self.parse_task_id(task_id)
        s = self._string(split, index)
        return Task(task_id=task_id, prompt=f"rev {s}=", answer=s[::-1])

    def reward(self, task: Task, completion: str) -> float:
        """Fraction of positions right, over the longer of answer and completion; 0 if malformed."""
        out = completion.strip()
        if not out or any(ch not in self.alphabet for ch in out):
            return 0.0
        hits = sum(a == b for a, b in zip(out, task.answer, strict=False))
        return hits / max(len(out), len(task.answer))

    def noisy_answer(self, task: Task, rng: random.Random, error_rate: float) -> str:
        # Each character independently becomes its alphabet successor (7 -> 8, 9 -> 0). The
        # error is per character, not per answer, so the model never has to track a "mode"
        # across positions: every output position is the same two-way choice for RL to settle.
        return "".join(
            self.alphabet[(self.alphabet.index(c) + 1) % len(self.alphabet)]
            if rng.random() < error_rate
            else c
            for c in task.answer
        )
