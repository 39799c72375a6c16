"""Arithmetic with a Python tool: the model may run code, read its output, and then answer.

Tool-call syntax: a fenced block opened by ```python (or ```py, any case) on a line of its own
and closed by ```. Every block of a turn runs, joined in order, as one cell of a Python REPL; a
block left open at the end of a turn runs too (a model cut off at its token cap still called the
tool). The environment replies with what the cell printed:

    Output:
    1529

as a REPL shows it (stdout and stderr, a final bare expression's repr, a traceback of the cell's
own frames for an exception), capped at `tool_output_chars` (run_cells cuts it with its
TRUNCATED line), or `Output: (none)` when it printed nothing. A turn without a block is the final
answer: the episode ends and scores 1.0 when the turn's last integer is the answer ("1,529" reads
as 1529), else 0.0; an episode that never answers within `max_turns` scores 0.0.

The REPL persists across the episode's tool calls because each call replays the episode's earlier
cells before the new one in a fresh sandbox (`run_cells`): the output is a pure function of the
task and the turns, which is what lets a validator check every reply. A cell the sandbox stops
(time, memory, a refused operation, an output flood) shows a fixed message instead of output;
the session it killed is gone, so the next tool call ends the episode (replaying would only die
again), and the model may still answer instead.

Warm start: a demonstration episode (`demonstration`) is the tool call that computes the answer,
then the answer; `noisy_answer`, the one-turn demonstration, is its first turn, the tool call.
The injected habit is answering at once, off by one (a slip of mental arithmetic), which the
reward removes.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prime_swarm.libs.environments.base import Task
from prime_swarm.libs.environments.problems import SeededProblemEnv
from prime_swarm.libs.environments.sandbox import Limits, run_cells

# A tool call needs milliseconds; these bound what a looping or sleeping one costs worker and
# validator on every later call of the episode (each call replays the earlier cells).
LIMITS = Limits(wall_s=3.0, cpu_s=2)
TOOL_OUTPUT_CHARS = 512

CODE_BLOCK = re.compile(r"```(?i:python|py)[ \t]*\r?\n(.*?)(?:```|\Z)", re.DOTALL)
INTEGER = re.compile(r"-?\d+")
THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
NO_OUTPUT = "Output: (none)\n"


def code_of(turn: str) -> str | None:
    """The cell a turn sends to the Python tool (its fenced blocks joined), or None if none."""
    blocks = CODE_BLOCK.findall(turn)
    return "\n".join(blocks) if blocks else None


def tool_reply(
    cells: Sequence[str], limits: Limits, output_chars: int, setup: str = ""
) -> str | None:
    """The reply to the last of an episode's tool cells, all of them replayed after `setup`; None
    when an earlier cell (or setup) stopped the interpreter: the session is gone."""
    result = run_cells(cells, limits, setup=setup, max_output_chars=output_chars)
    if result.cell != len(cells) - 1:
        return None
    return "Output:\n" + result.output if result.output else NO_OUTPUT


def last_integer(text: str) -> str | None:
    found = INTEGER.findall(THOUSANDS.sub("", text))
    return found[-1] if found else None


@dataclass(frozen=True)
class Family:
    """One kind of question. `params` turns a hash into the question's numbers; `code` computes
    the answer in Python (the warm start's tool call) and `answer` computes it here."""

    question: str
    params: Callable[[int], dict[str, int]]
    code: str
    answer: Callable[..., int]


def _digits(h: int, *spans: tuple[int, int]) -> list[int]:
    """Integers in the inclusive ranges `spans`, drawn from `h` in turn."""
    values = []
    for lo, hi in spans:
        h, r = divmod(h, hi - lo + 1)
        values.append(lo + r)
    return values


FAMILIES: dict[str, Family] = {
    "mul_add": Family(
        "What is {a}*{b}+{c}?",
        lambda h: dict(zip("abc", _digits(h, (11, 99), (11, 99), (1, 99)), strict=True)),
        "{a}*{b}+{c}",
        lambda a, b, c: a * b + c,
    ),
    "mul_sub": Family(
        "What is {a}*{b}-{c}*{d}?",
        lambda h: dict(zip("abcd", _digits(h, *[(11, 99)] * 4), strict=True)),
        "{a}*{b}-{c}*{d}",
        lambda a, b, c, d: a * b - c * d,
    ),
    "range_sum": Family(
        "What is the sum of all the integers from {a} to {b}?",
        lambda h: (lambda a, n: {"a": a, "b": a + n})(*_digits(h, (1, 99), (100, 999))),
        "sum(range({a}, {b} + 1))",
        lambda a, b: sum(range(a, b + 1)),
    ),
    "pow_mod": Family(
        "What is the remainder when {a} to the power {k} is divided by {m}?",
        lambda h: dict(zip("akm", _digits(h, (2, 99), (10, 99), (7, 997)), strict=True)),
        "pow({a}, {k}, {m})",
        lambda a, k, m: pow(a, k, m),
    ),
    "digit_sum": Family(
        "What is the sum of the digits of {a} to the power {k}?",
        lambda h: dict(zip("ak", _digits(h, (2, 99), (5, 30)), strict=True)),
        "sum(int(d) for d in str({a}**{k}))",
        lambda a, k: sum(int(d) for d in str(a**k)),
    ),
    "crates": Family(
        "A crate holds {a} apples. A shop buys {n} crates and sells {s} apples. How many apples "
        "does it have left?",
        lambda h: (lambda a, n, s: {"a": a, "n": n, "s": s % (a * n)})(
            *_digits(h, (12, 48), (11, 99), (0, 10**6))
        ),
        "{a}*{n}-{s}",
        lambda a, n, s: a * n - s,
    ),
}

Problem = tuple[str, tuple[tuple[str, int], ...]]  # (family, sorted params)


class PythonToolEnv(SeededProblemEnv[Problem]):
    runs_code = True

    def __init__(
        self,
        name: str = "python-tool",
        max_turns: int = 4,
        tool_output_chars: int = TOOL_OUTPUT_CHARS,
        limits: Limits = LIMITS,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.name, self.max_turns = name, max_turns
        self.tool_output_chars, self.limits = tool_output_chars, limits
        self.families = sorted(FAMILIES)
        # Per turn: a tool call of a few lines, or an answer with a sentence around it.
        self.max_answer_chars = 400

    def draw(self, family: str, h: int) -> Problem:
        return family, tuple(sorted(FAMILIES[family].params(h).items()))

    def task_from_id(self, task_id: str) -> Task:
        split, index = self.parse_task_id(task_id)
        family, params = self.problem(split, index)
        fam, values = FAMILIES[family], dict(params)
        prompt = (
            f"{fam.question.format(**values)}\n\n"
            "You can run Python: write code in a ```python block and I will reply with its "
            "output (a final bare expression is echoed, and variables persist between blocks). "
            "When you know the answer, reply without a code block and end with the number."
        )
        return Task(task_id=task_id, prompt=prompt, answer=str(fam.answer(**values)))

    def reply(self, task: Task, turns: Sequence[str]) -> str | None:
        """The tool's output for a turn that calls it; None after the final answer, after
        `max_turns` turns, or when an earlier cell killed the session."""
        if not turns or len(turns) >= self.max_turns:
            return None
        cells = [code_of(turn) for turn in turns]
        if None in cells:  # a final answer, the last turn's or an earlier one's
            return None
        return tool_reply(cells, self.limits, self.tool_output_chars)  # type: ignore[arg-type]

    def score(self, task: Task, turns: Sequence[str]) -> float:
        for turn in turns[: self.max_turns]:
            if code_of(turn) is None:
                return self.reward(task, turn)
        return 0.0  # never answered

    def reward(self, task: Task, completion: str) -> float:
        """A final answer's score: 1.0 when its last integer is the answer."""
        return 1.0 if last_integer(completion) == task.answer else 0.0

    def demonstration(self, task: Task, rng: random.Random, error_rate: float) -> list[str]:
        """A warm-start episode: the tool call that computes the answer, then the answer; at
        `error_rate` an immediate answer, off by one (the habit to remove)."""
        if rng.random() < error_rate:
            return [str(int(task.answer) + 1)]
        split, index = self.parse_task_id(task.task_id)
        family, params = self.problem(split, index)
        code = FAMILIES[family].code.format(**dict(params))
        return [f"```python\n{code}\n```", task.answer]

    def noisy_answer(self, task: Task, rng: random.Random, error_rate: float) -> str:
        # The first turn of a demonstration (see the module's docstring).
        return self.demonstration(task, rng, error_rate)[0]
