"""Tiny function-writing problems: `# f(x)=x+3` -> `def f(x):return x+3`.

The reward is the fraction of hidden tests the completion's `f` passes, run in the sandbox of
libs/environments/sandbox/; anything that fails to load, times out or tries to escape scores 0. A
2-layer model will not learn this; the env exists so that the RL stack has a code-execution
reward behind the same interface as the others.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prime_swarm.libs.environments.base import Env, Split, Task, hash_int
from prime_swarm.libs.environments.sandbox import Case, Limits, run_tests

# There are only ~50 distinct problems, so a larger share than elsewhere is held out: with 10%
# the held-out score would rest on a handful of them.
HELDOUT_PERCENT = 20
N_TESTS = 5
# A correct solution needs milliseconds; these bound what a looping one costs the caller.
LIMITS = Limits(wall_s=3.0, cpu_s=1)


@dataclass(frozen=True)
class Family:
    """One kind of problem; `k` is its parameter (None for the parameterless ones)."""

    arg: str  # "x" (an int), "s" (a str) or "xs" (a list of ints)
    spec: str  # what the prompt says f returns, with {k}
    solution: str  # the body of a correct f, with {k}
    buggy: str  # the body of a plausible wrong f, with {k} and {k1} = k + 1
    reference: Callable[[Any, Any], Any]  # (input, k) -> expected output
    ks: tuple[int | None, ...] = (None,)


FAMILIES: dict[str, Family] = {
    "add": Family("x", "x+{k}", "x+{k}", "x+{k1}", lambda x, k: x + k, tuple(range(1, 10))),
    "sub": Family("x", "x-{k}", "x-{k}", "{k}-x", lambda x, k: x - k, tuple(range(1, 10))),
    "mul": Family("x", "x*{k}", "x*{k}", "x+{k}", lambda x, k: x * k, tuple(range(2, 10))),
    "mod": Family("x", "x%{k}", "x%{k}", "x//{k}", lambda x, k: x % k, tuple(range(2, 10))),
    "count": Family(
        "xs",
        "count of {k} in xs",
        "xs.count({k})",
        "xs.index({k})",
        lambda xs, k: xs.count(k),
        tuple(range(10)),
    ),
    "rev": Family("s", "s reversed", "s[::-1]", "s[:0:-1]", lambda s, _: s[::-1]),
    "upper": Family("s", "s in upper case", "s.upper()", "s.title()", lambda s, _: s.upper()),
    "len": Family("s", "length of s", "len(s)", "len(s)-1", lambda s, _: len(s)),
    "max": Family("xs", "max of xs", "max(xs)", "xs[-1]", lambda xs, _: max(xs)),
    "min": Family("xs", "min of xs", "min(xs)", "xs[0]", lambda xs, _: min(xs)),
    "sum": Family("xs", "sum of xs", "sum(xs)", "sum(xs[1:])", lambda xs, _: sum(xs)),
}

Spec = tuple[str, int | None]  # (family name, k)


class CodeEnv(Env):
    runs_code = True

    def __init__(self, name: str = "code", limits: Limits = LIMITS) -> None:
        self.name = name
        self.limits = limits
        specs = [(fam, k) for fam, family in FAMILIES.items() for k in family.ks]
        self.specs: dict[Split, list[Spec]] = {
            split: [s for s in specs if self.split_of(s) == split] for split in ("train", "heldout")
        }
        if not all(self.specs.values()):  # the partition hashes the name, so it could happen
            raise ValueError(f"env name {name!r} leaves a split without problems")
        self.max_answer_chars = max(len(self._source(s, FAMILIES[s[0]].solution)) for s in specs)

    def split_of(self, spec: Spec) -> Split:
        # Membership depends on the problem, not on the task index, so a held-out problem is
        # never trained on under another id (its hidden tests differ, its prompt does not).
        return "heldout" if hash_int(self.name, "split", *spec) % 100 < HELDOUT_PERCENT else "train"

    @staticmethod
    def _source(spec: Spec, body: str) -> str:
        fam, k = spec
        k1 = None if k is None else k + 1
        return f"def f({FAMILIES[fam].arg}):return {body.format(k=k, k1=k1)}"

    def _spec(self, split: Split, index: int) -> Spec:
        pool = self.specs[split]
        return pool[hash_int(self.name, split, index, "spec") % len(pool)]

    @staticmethod
    def _input(arg: str, k: int | None, h: int) -> Any:
        if arg == "x":
            return h % 151 - 50  # negatives too: x%k and k-x must really be right
        if arg == "s":
            h, n = divmod(h, 9)
            return "".join(string.ascii_lowercase[(h >> (5 * i)) % 26] for i in range(n))
        h, n = divmod(h, 6)
        xs = []
        for _ in range(n + 1):  # non-empty, for max and min
            h, r = divmod(h, 63)
            value, hit = divmod(r, 3)
            # With a k (count), a third of the items are k, so that counts are rarely all 0.
            xs.append(k if k is not None and hit == 0 else value - 10)
        return xs

    def cases(self, task_id: str) -> list[Case]:
        """The hidden tests of a task, re-derived from its id."""
        split, index = self.parse_task_id(task_id)
        fam, k = self._spec(split, index)
        family = FAMILIES[fam]
        inputs = [
            self._input(family.arg, k, hash_int(self.name, task_id, "case", j, nbytes=16))
            for j in range(N_TESTS)
        ]
        return [Case((x,), family.reference(x, k)) for x in inputs]

    def task_from_id(self, task_id: str) -> Task:
        split, index = self.parse_task_id(task_id)
        spec = self._spec(split, index)
        family = FAMILIES[spec[0]]
        prompt = f"# f({family.arg})={family.spec.format(k=spec[1])}\n"
        return Task(task_id=task_id, prompt=prompt, answer=self._source(spec, family.solution))

    def reward(self, task: Task, completion: str) -> float:
        """Fraction of the hidden tests passed; 0 if the code fails to load, runs out of time or
        memory, floods its output or attempts anything the sandbox refuses."""
        source = completion.strip()
        if not source:
            return 0.0
        result = run_tests(source, "f", self.cases(task.task_id), self.limits)
        return result.tests_passed / result.tests_total if result.reason == "ok" else 0.0

    def noisy_answer(self, task: Task, rng: random.Random, error_rate: float) -> str:
        # Each family has one characteristic bug (off by one, operands swapped, first/last item
        # instead of the extreme): a consistent habit for RL to remove, not random noise. Some
        # still pass a test now and then (a one-letter string title-cased, a list whose last
        # item is its largest), which is what partial credit is for.
        if rng.random() >= error_rate:
            return task.answer
        split, index = self.parse_task_id(task.task_id)
        spec = self._spec(split, index)
        return self._source(spec, FAMILIES[spec[0]].buggy)
