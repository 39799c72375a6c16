"""Recursive-language-model style tasks: the input is too long for the prompt, so it lives only in
a Python REPL as the variable `context`, and the model answers by running code on it.

The prompt gives the question, what `context` is and how long, and how to use the REPL; the input
itself (by default 1000 integers or 1000 CSV lines: about 5k or 16k chars) is never in the
prompt. Each model turn is code in a fenced ```python block (the syntax and the `Output:`
replies of python_tool.py), whose output (at most `tool_output_chars`) comes back; the REPL
persists across the episode (earlier cells are replayed after the setup that defines
`context`). The model ends with `FINAL(<answer>)`, or with any turn without code (then the whole
turn is its answer); the episode scores 1.0 when the answer is exactly the expected one, else
0.0, and 0.0 if it never answers within `max_turns`. Printing `context` shows only its first
`tool_output_chars` chars: reading the input means computing on it, which is the point.

The input is derived from the task id (a seeded hash stream), so worker and validator build the
same `context`; train and held-out tasks never share an input.

Out of scope: the sub-LLM calls of recursive language models (`llm_query` on a slice of the
context from inside the REPL). A model call inside the sandbox would be neither deterministic nor
affordable for a validator replaying the episode, so the REPL here is plain Python.

Warm start: a demonstration episode (`demonstration`) is the code that computes the answer and
prints it, then FINAL(answer); `noisy_answer`, the one-turn demonstration, is its first turn.
The injected habit is an off-by-one at an edge (`>=` for `>`, the first line or the last entry
skipped, the last of tied maxima), which the reward removes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from prime_swarm.libs.environments.base import Task
from prime_swarm.libs.environments.problems import SeededProblemEnv
from prime_swarm.libs.environments.python_tool import TOOL_OUTPUT_CHARS, code_of, tool_reply
from prime_swarm.libs.environments.sandbox import Limits

LIMITS = Limits(wall_s=3.0, cpu_s=2)
FINAL = re.compile(r"FINAL\(([^()]*)\)")
CITIES = ("Lima", "Oslo", "Pune", "Rome", "Kyiv", "Baku", "Doha", "Riga")


@dataclass(frozen=True)
class Family:
    """One kind of question. `kind` is what `context` holds ("numbers": a list of ints in
    0..999, "orders": CSV text `order_id,city,amount`); `code` and `buggy` are the warm start's
    first turns, right and with the family's edge mistake, formatted with `param`."""

    kind: str
    question: str
    code: str
    buggy: str


FAMILIES: dict[str, Family] = {
    "count_above": Family(
        "numbers",
        "How many entries of `context` are greater than {param}?",
        "print(sum(1 for x in context if x > {param}))",
        "print(sum(1 for x in context if x >= {param}))",
    ),
    "sum_divisible": Family(
        "numbers",
        "What is the sum of the entries of `context` that are divisible by {param}?",
        "print(sum(x for x in context if x % {param} == 0))",
        "print(sum(x for x in context[:-1] if x % {param} == 0))",
    ),
    "argmax": Family(
        "numbers",
        "At which index (0-based) is the largest entry of `context`? If it occurs more than "
        "once, the first such index.",
        "print(context.index(max(context)))",
        "print(max(range(len(context)), key=lambda i: (context[i], i)))",
    ),
    "city_total": Family(
        "orders",
        "What is the total amount of the orders from {param}?",
        "rows = [line.split(',') for line in context.splitlines()]\n"
        "print(sum(int(r[2]) for r in rows if r[1] == '{param}'))",
        "rows = [line.split(',') for line in context.splitlines()[1:]]\n"
        "print(sum(int(r[2]) for r in rows if r[1] == '{param}'))",
    ),
}


def _param(family: str, h: int) -> int | str:
    if family == "count_above":
        return 100 + h % 800
    if family == "sum_divisible":
        return 3 + h % 11
    if family == "city_total":
        return CITIES[h % len(CITIES)]
    return 0  # argmax has none


Problem = tuple[str, int | str, int]  # (family, param, input seed)


class RLMEnv(SeededProblemEnv[Problem]):
    runs_code = True

    def __init__(
        self,
        name: str = "rlm",
        size: int = 1000,
        max_turns: int = 6,
        tool_output_chars: int = TOOL_OUTPUT_CHARS,
        limits: Limits = LIMITS,
    ) -> None:
        """`size`: entries of `context` (numbers or CSV lines); the default is about 5k chars of
        numbers or 16k of CSV, more than a small model's whole context window."""
        if not 10 <= size <= 20_000:
            raise ValueError(f"size must be 10..20000, got {size}")
        if max_turns < 2:
            raise ValueError("max_turns must be at least 2: one turn of code, one answer")
        self.name, self.size, self.max_turns = name, size, max_turns
        self.tool_output_chars, self.limits = tool_output_chars, limits
        self.families = sorted(FAMILIES)
        self.max_answer_chars = 400

    def draw(self, family: str, h: int) -> Problem:
        # The input's seed is part of the problem, so no input is in both splits.
        return family, _param(family, h % 10_000), h // 10_000 % 2**48

    def context(self, kind: str, seed: int) -> list[int] | str:
        """The task's input: a sha256 counter-mode stream from `seed`, the same everywhere."""
        stream = b"".join(
            hashlib.sha256(f"{self.name}:context:{seed}:{block}".encode()).digest()
            for block in range((4 * self.size + 31) // 32)
        )
        words = [int.from_bytes(stream[4 * i : 4 * i + 4], "big") for i in range(self.size)]
        if kind == "numbers":
            return [w % 1000 for w in words]
        lines = (
            f"{100000 + i},{CITIES[w % len(CITIES)]},{1 + (w >> 8) % 500}"
            for i, w in enumerate(words)
        )
        return "\n".join(lines)

    @staticmethod
    def _answer(
        family: str, param: int | str, context: list[int] | str, buggy: bool = False
    ) -> int:
        """The answer; with `buggy`, what the family's `buggy` code prints instead."""
        if isinstance(context, str):  # city_total; the bug skips the first line
            rows = [line.split(",") for line in context.splitlines()[int(buggy) :]]
            return sum(int(r[2]) for r in rows if r[1] == param)
        if family == "count_above":
            return sum(1 for x in context if x >= int(param) + int(not buggy))
        if family == "sum_divisible":
            return sum(x for x in context[: len(context) - buggy] if x % int(param) == 0)
        if buggy:  # argmax: the last of the tied maxima
            return len(context) - 1 - context[::-1].index(max(context))
        return context.index(max(context))

    def task_from_id(self, task_id: str) -> Task:
        split, index = self.parse_task_id(task_id)
        family, param, seed = self.problem(split, index)
        fam = FAMILIES[family]
        context = self.context(fam.kind, seed)
        if fam.kind == "numbers":
            what = f"a Python list of {self.size} integers from 0 to 999"
        else:
            what = (
                f"a Python str of {self.size} lines `order_id,city,amount` "
                f"({len(context)} chars, no header)"
            )
        prompt = (
            f"`context` is {what}. It is not shown here: it exists only in a Python REPL. "
            f"Question: {fam.question.format(param=param)}\n\n"
            "Run code in a ```python block and I will reply with its output (at most "
            f"{self.tool_output_chars} characters; variables persist between blocks). "
            "When you know the answer, reply FINAL(<answer>)."
        )
        answer = str(self._answer(family, param, context))
        return Task(task_id=task_id, prompt=prompt, answer=answer)

    def setup(self, task: Task) -> str:
        """The REPL's setup cell: `context` as a literal (about 5 chars per entry)."""
        split, index = self.parse_task_id(task.task_id)
        family, _, seed = self.problem(split, index)
        return f"context = {self.context(FAMILIES[family].kind, seed)!r}\n"

    @staticmethod
    def final(turn: str) -> str | None:
        """A turn's answer, or None when it is a tool call: FINAL(...)'s content (the last one
        written), else the whole turn if it holds no code."""
        found = FINAL.findall(turn)
        if found:
            return found[-1].strip()
        return turn.strip() if code_of(turn) is None else None

    def reply(self, task: Task, turns: Sequence[str]) -> str | None:
        """The REPL's output for a turn of code; None after an answer, after `max_turns` turns,
        or when an earlier cell killed the session."""
        if not turns or len(turns) >= self.max_turns:
            return None
        if any(self.final(turn) is not None for turn in turns):
            return None
        setup = self.setup(task)
        # The setup is the environment's, not the model's: its length does not count.
        limits = dataclasses.replace(
            self.limits, max_source_chars=self.limits.max_source_chars + len(setup)
        )
        cells = [code_of(turn) or "" for turn in turns]
        return tool_reply(cells, limits, self.tool_output_chars, setup=setup)

    def score(self, task: Task, turns: Sequence[str]) -> float:
        for turn in turns[: self.max_turns]:
            answer = self.final(turn)
            if answer is not None:
                return 1.0 if answer == task.answer else 0.0
        return 0.0  # never answered

    def reward(self, task: Task, completion: str) -> float:
        """A one-turn episode's score: an answer given without running any code."""
        return self.score(task, [completion])

    def demonstration(self, task: Task, rng: random.Random, error_rate: float) -> list[str]:
        """A warm-start episode: code that computes the answer and prints it, then FINAL(answer);
        at `error_rate` the family's edge mistake, in the code and so in the answer."""
        buggy = rng.random() < error_rate
        split, index = self.parse_task_id(task.task_id)
        family, param, seed = self.problem(split, index)
        fam = FAMILIES[family]
        answer = self._answer(family, param, self.context(fam.kind, seed), buggy)
        code = (fam.buggy if buggy else fam.code).format(param=param)
        return [f"```python\n{code}\n```", f"FINAL({answer})"]

    def noisy_answer(self, task: Task, rng: random.Random, error_rate: float) -> str:
        # The first turn of a demonstration (see the module's docstring).
        return self.demonstration(task, rng, error_rate)[0]
