"""Small-integer arithmetic: `12+7=` -> `19`, `31-4=` -> `27`, `6*7=` -> `42`.

The reward is all-or-nothing (an arithmetic answer with one wrong digit is simply wrong), so
this env is a sparser signal than `reverse`; operands stay small so that the prompt and the
answer fit the tiny model's 64-token byte-level context with room to spare.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from prime_swarm.libs.environments.base import Env, Split, Task, hash_int

HELDOUT_PERCENT = 10
OPS = ("+", "-", "*")


class ArithEnv(Env):
    def __init__(
        self,
        name: str = "arith",
        ops: Sequence[str] = OPS,
        max_operand: int = 99,
        max_factor: int = 12,
        allow_negative: bool = False,
    ) -> None:
        """`max_operand` bounds `+`/`-` operands and `max_factor` bounds `*` operands (0 up to
        the bound, inclusive): products grow fast, and a times table is what a tiny model can
        plausibly memorise. Without `allow_negative`, `a-b` always has `a >= b`."""
        if not ops or any(op not in OPS for op in ops):
            raise ValueError(f"ops must be a non-empty subset of {OPS}, got {ops!r}")
        if max_operand < 1 or max_factor < 1:
            raise ValueError("operand bounds must be at least 1")
        self.name = name
        self.ops = tuple(ops)
        self.max_operand = max_operand
        self.max_factor = max_factor
        self.allow_negative = allow_negative
        # |answer| is largest at a corner of the operand box, and so is its length.
        self.max_answer_chars = max(
            len(self._answer(op, a, b))
            for op in self.ops
            for a, b in (
                (self._bound(op), self._bound(op)),
                (self._bound(op), 0),
                (0, self._bound(op)),
            )
            if self._allowed(op, a, b)
        )

    def _bound(self, op: str) -> int:
        return self.max_factor if op == "*" else self.max_operand

    def _allowed(self, op: str, a: int, b: int) -> bool:
        return op != "-" or self.allow_negative or a >= b

    @staticmethod
    def _answer(op: str, a: int, b: int) -> str:
        return str(a + b if op == "+" else a - b if op == "-" else a * b)

    def split_of(self, op: str, a: int, b: int) -> Split:
        # Membership depends on the problem itself, so the splits are disjoint by construction.
        # Commutative problems are keyed on their sorted operands: `7+12` must not be held out
        # while `12+7` is trained on, or the held-out score would measure memorisation.
        if op in "+*":
            a, b = min(a, b), max(a, b)
        return (
            "heldout" if hash_int(self.name, "split", op, a, b) % 100 < HELDOUT_PERCENT else "train"
        )

    def _problem(self, split: Split, index: int) -> tuple[str, int, int]:
        # Rejection-sample until the problem falls in the requested split (~1.1 tries for train).
        for attempt in range(10_000):
            h = hash_int(self.name, index, attempt, nbytes=16)
            h, k = divmod(h, len(self.ops))
            op = self.ops[k]
            h, a = divmod(h, self._bound(op) + 1)
            b = h % (self._bound(op) + 1)
            if not self._allowed(op, a, b):
                a, b = b, a
            if self.split_of(op, a, b) == split:
                return op, a, b
        raise RuntimeError("no problem found for the split")  # unreachable in practice

    def task_from_id(self, task_id: str) -> Task:
        split, index = self.parse_task_id(task_id)
        op, a, b = self._problem(split, index)
        return Task(task_id=task_id, prompt=f"{a}{op}{b}=", answer=self._answer(op, a, b))

    def reward(self, task: Task, completion: str) -> float:
        """1.0 for exactly the answer (surrounding whitespace aside), else 0.0: `019`, `19.0`
        or `19 ` followed by more text are all wrong, so there is no format to game."""
        return 1.0 if completion.strip() == task.answer else 0.0

    def noisy_answer(self, task: Task, rng: random.Random, error_rate: float) -> str:
        # With probability `error_rate` the last digit is off by one (9 wraps to 0, no carry):
        # one consistent, learnable slip rather than random noise, so that RL has a specific
        # bad habit to remove.
        if rng.random() >= error_rate:
            return task.answer
        last = int(task.answer[-1])
        return task.answer[:-1] + str((last + 1) % 10)
