"""The environment contract: tasks re-derivable from their id and a rule-based reward in [0, 1].

An episode is one turn or many. After each model turn the environment answers (`reply`: a tool's
output, a game's feedback) or ends the episode (None); the reward scores the whole episode
(`score`). A worker runs the episode, and a validator runs it again on the worker's claimed model
turns and refuses a rollout whose environment tokens differ (libs/rollout/episode.py). So an
environment must be **deterministic given the task and the model's turns**: no wall clock, no
network, no unseeded randomness, no state kept between calls (the validator replays episodes in
any order, and not every one it replays is honest). A single-turn environment keeps the
defaults: `max_turns` 1, `reply` None, `score` = `reward` of the one turn.
"""

from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from prime_swarm.protocol.messages import Prompt

Split = Literal["train", "heldout"]
SPLITS: tuple[Split, ...] = ("train", "heldout")


class Task(BaseModel):
    model_config = ConfigDict(frozen=True)

    task_id: str
    prompt: Prompt
    """Raw text, or chat messages that the model's chat template renders."""
    answer: str


def hash_int(*parts: object, nbytes: int = 8) -> int:
    """A platform- and version-independent integer from `parts`.

    Task derivation uses sha256 rather than numpy/random generators because a validator on
    another machine (other numpy, other Python) must derive the very same task from its id.
    """
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:nbytes], "big")


class Env(ABC):
    name: str
    max_answer_chars: int

    def task_id(self, split: Split, index: int) -> str:
        return f"{self.name}/{split}/{index}"

    def parse_task_id(self, task_id: str) -> tuple[Split, int]:
        name, split, index = task_id.split("/")
        if name != self.name or split not in SPLITS or not index.isdigit():
            raise ValueError(f"not a {self.name} task id: {task_id!r}")
        return split, int(index)  # type: ignore[return-value]

    def sample_tasks(self, seed: int, n: int, split: Split) -> list[Task]:
        """`n` tasks of `split`, a pure function of (seed, split)."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}")
        indices = (hash_int(self.name, split, seed, k, nbytes=6) for k in range(n))
        return [self.task_from_id(self.task_id(split, i)) for i in indices]

    @abstractmethod
    def task_from_id(self, task_id: str) -> Task:
        """Re-derive the task from its id alone (the id encodes split and index)."""

    runs_code: bool = False
    """Its replies or rewards run code in the sandbox (tool cells, tests): a worker or
    validator then needs the pool's pinned tool interpreter (`Recipe.tool_python`)."""

    max_turns: int = 1
    """The most model turns an episode holds; the episode ends after this many whatever
    `reply` would say."""

    @abstractmethod
    def reward(self, task: Task, completion: str) -> float:
        """Rule-based score of `completion` (decoded text, specials dropped) in [0, 1]."""

    def reply(self, task: Task, turns: Sequence[str]) -> str | None:
        """The environment's answer to the model's turns so far (each decoded, specials dropped),
        or None when the episode is over. A pure function of (task, turns): the validator calls
        it again on the claimed turns. The text is what the model reads next: raw text for a
        model without a chat template, a user message's content for one with."""
        return None

    def score(self, task: Task, turns: Sequence[str]) -> float:
        """The episode's reward in [0, 1], a pure function of (task, turns)."""
        return self.reward(task, turns[-1])

    def format_score(self, task: Task, turns: Sequence[str]) -> float | None:
        """How well the episode keeps the answer format the prompt asks for, in [0, 1], a pure
        function of (task, turns); None: this environment asks for no format. The recipe's
        `format_reward` weighs it into the reward (a model that cannot yet answer can still be
        taught the format); held-out accuracy never counts it."""
        return None

    def demonstration(self, task: Task, rng: random.Random, error_rate: float) -> list[str]:
        """The model turns of one warm-start demonstration episode (the environment's replies
        between them come from `reply`, as in a real episode). One turn by default: the noisy
        answer. A multi-turn environment demonstrates the format of its later turns too."""
        return [self.noisy_answer(task, rng, error_rate)]

    @abstractmethod
    def noisy_answer(self, task: Task, rng: random.Random, error_rate: float) -> str:
        """The answer with a systematic mistake injected at `error_rate`.

        Used for the SFT warm start's demonstrations, so that the warm-started policy has the
        task's structure but a bad habit that RL can remove.
        """
