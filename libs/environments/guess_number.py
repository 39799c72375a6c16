"""Guess the number: the smallest multi-turn task. The model guesses a secret integer, the
environment answers whether the secret is higher or lower, and the episode ends at the right
guess, at a turn that is not a number, or after `max_turns` guesses.

The reward favours finding it early: 1.0 at the first guess, `1/max_turns` less for each guess
after it, 0.0 if never found. With the default range 0..9 and 4 turns, binary search always wins
(at worst 0.25), and a model must read the replies to do better than chance after its first
guess, which is what makes this a test of the multi-turn machinery rather than of memory.

Compact by default, for the tiny byte-level model whose 64-token context holds the prompt, every
turn and every reply (one token per byte): the prompt is `guess 0-9:` (10 bytes), a turn is the
guess then EOS, a reply is one byte, `+` (the secret is higher) or `-` (lower). BOS, the prompt,
4 turns of 2 tokens and 3 replies make 22 tokens. `verbose=True` words the prompt and the replies
for an instruct model, and reads a turn's last integer as its guess (an instruct model says "My
guess is 50.").

Warm start: the prompt says nothing about the secret, so no first turn can be "the answer". The
best first guess is the range's midpoint, which opens a binary search: that is `noisy_answer`,
the one-turn demonstration. `demonstration` plays the whole binary search on the replies, so a
multi-turn warm start also shows what `+` and `-` mean. The injected bad habit is reading a reply
backwards (searching below after `+`), at `error_rate` for each reply: above 0.5 the warm-started
model's greedy search runs away from the secret, and only a model that learned what the replies
mean finds a held-out secret after its first guess. That is the headroom RL has to close, and it
can be closed only by reading the environment's replies, which is the point of the game.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from prime_swarm.libs.environments.base import Env, Task, hash_int

INTEGER = re.compile(r"-?\d+")
MAX_SPAN = 10_000


class GuessNumberEnv(Env):
    def __init__(
        self,
        name: str = "guess-number",
        low: int = 0,
        high: int = 9,
        max_turns: int = 4,
        verbose: bool = False,
    ) -> None:
        """Secrets are uniform in `low..high` (inclusive) in both splits. A held-out task is an
        episode never trained on, over the same secrets: the prompt says nothing about the
        secret, so there is nothing to remember, only a search to learn. (Held-out *secrets*
        would measure a distribution shift instead: a policy trained where 1 and 6 never pay
        learns never to guess them, and scores 0 on them however well it searches.)"""
        if not 0 <= low < high or high - low + 1 > MAX_SPAN:
            raise ValueError(f"need 0 <= low < high and at most {MAX_SPAN} secrets")
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.name, self.low, self.high = name, low, high
        self.max_turns = max_turns
        self.verbose = verbose
        if verbose:
            self.prompt = (
                f"I am thinking of an integer from {low} to {high}. Guess it in at most "
                f"{max_turns} tries. Reply with just your guess; after each wrong guess I will "
                "say whether my number is higher or lower."
            )
            self.higher, self.lower = "Higher.", "Lower."
            self.max_answer_chars = 16
        else:
            self.prompt = f"guess {low}-{high}:"
            self.higher, self.lower = "+", "-"
            self.max_answer_chars = len(str(high))

    def task_from_id(self, task_id: str) -> Task:
        split, index = self.parse_task_id(task_id)
        secret = self.low + hash_int(self.name, split, index) % (self.high - self.low + 1)
        return Task(task_id=task_id, prompt=self.prompt, answer=str(secret))

    def guess(self, turn: str) -> int | None:
        """The number a turn guesses, or None when it is not a guess. Compact: the turn is the
        number and nothing else (`7`, not `07` or `7!`); verbose: its last integer."""
        if self.verbose:
            found = INTEGER.findall(turn)
            return int(found[-1]) if found else None
        text = turn.strip()
        if not INTEGER.fullmatch(text) or str(int(text)) != text:
            return None
        return int(text)

    def reply(self, task: Task, turns: Sequence[str]) -> str | None:
        """`+`/`-` (verbose: "Higher."/"Lower.") after a wrong guess; None once the episode is
        over: the right guess, a turn that is no guess, or `max_turns` turns."""
        if not turns or len(turns) >= self.max_turns:
            return None
        secret = int(task.answer)
        for turn in turns:  # a pure function of all the turns: an earlier one may have ended it
            guess = self.guess(turn)
            if guess is None or guess == secret:
                return None
        return self.higher if secret > guess else self.lower

    def score(self, task: Task, turns: Sequence[str]) -> float:
        """1 - (t - 1) / max_turns for the right guess at turn t; 0.0 if the episode ends
        without one."""
        secret = int(task.answer)
        for t, turn in enumerate(turns[: self.max_turns]):
            guess = self.guess(turn)
            if guess is None:
                return 0.0
            if guess == secret:
                return 1.0 - t / self.max_turns
        return 0.0

    def reward(self, task: Task, completion: str) -> float:
        """A one-turn episode's score: 1.0 for a lucky first guess."""
        return self.score(task, [completion])

    def demonstration(self, task: Task, rng: random.Random, error_rate: float) -> list[str]:
        """A whole warm-start episode: a binary search on the replies, each reply read backwards
        at `error_rate` (the habit RL removes). A search whose range runs out guesses at the
        nearer end of the game's range."""
        secret, lo, hi = int(task.answer), self.low, self.high
        turns: list[str] = []
        while len(turns) < self.max_turns:
            guess = min(max((lo + hi) // 2, self.low), self.high)
            turns.append(str(guess))
            if guess == secret:
                break
            higher = secret > guess
            if rng.random() < error_rate:
                higher = not higher
            lo, hi = (guess + 1, max(hi, guess + 1)) if higher else (min(lo, guess - 1), guess - 1)
        return turns

    def noisy_answer(self, task: Task, rng: random.Random, error_rate: float) -> str:
        # The first turn of a binary search, whatever the secret (see the module's docstring).
        return str((self.low + self.high) // 2)
