"""Seeded problem families: how the REPL environments (python_tool.py, rlm.py) turn a task id into
a problem. A problem is a family's name and what that family draws from a hash (numbers, an
input's seed); the environment words it as a prompt and computes its answer.

The draw is a pure function of (environment name, split, index), so a validator re-derives the
task from its id alone. Which split a problem belongs to depends on the problem itself, so the
splits are disjoint by construction: the index's hashes are tried in turn (`attempt` 0, 1, ...)
until one draws a problem of the wanted split, about 1.1 tries for train.

Worker and validator results, recorded runs and task lists name tasks by id, so the draw here
must never change: the same id must give the same problem in every version.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

from prime_swarm.libs.environments.base import Env, Split, hash_int

HELDOUT_PERCENT = 10
P = TypeVar("P", bound=tuple[Hashable, ...])


class SeededProblemEnv(Env, Generic[P]):
    """An environment whose problems are drawn from named families by a seeded hash. A subclass
    sets `families` (sorted names: the draw picks one by index) and writes `draw`."""

    families: Sequence[str]

    @abstractmethod
    def draw(self, family: str, h: int) -> P:
        """The problem `family` makes from the hash `h`: a tuple starting with `family`, whose
        parts' str() say all of it (the split is hashed from them)."""

    def split_of(self, problem: P) -> Split:
        held = hash_int(self.name, "split", *problem) % 100 < HELDOUT_PERCENT
        return "heldout" if held else "train"

    def problem(self, split: Split, index: int) -> P:
        for attempt in range(10_000):
            h = hash_int(self.name, index, attempt, nbytes=16)
            family = self.families[h % len(self.families)]
            problem = self.draw(family, h // len(self.families))
            if self.split_of(problem) == split:
                return problem
        raise RuntimeError("no problem found for the split")  # unreachable in practice
