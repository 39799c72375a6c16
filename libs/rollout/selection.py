"""Live prompt selection: lease the prompts the policy can still learn from.

A group whose completions all score alike has zero advantage: it teaches nothing, yet a worker
generated it, a validator checked it and the chain paid for it before the trainer dropped it.
INTELLECT-2 filtered prompts by pass rate once, offline (`prime-swarm filter-tasks`); here the
pool does it as it trains. Each accepted group's mean task reward becomes its prompt's pass
rate (the validator records it, keyed by the prompt's text, so the same problem under another
task id shares it); the orchestrator, drawing the next task, skips a prompt whose rate says the
policy has mastered it (>= `mastered`) or cannot yet solve it (<= `unsolved`), except with
probability `explore`: no prompt is starved forever, and a skipped prompt's rate is re-measured
as the policy moves. Only the train split is ever leased, so the held-out set stays untouched.

The rate is the last group's, not an average over the run: the policy of ten versions ago is
not the one being trained. It is only as useful as prompts recur: a pool whose train split is
far larger than the run's prompts never sees one twice and selects nothing.

Torch-free: the orchestrator and the validator both use it.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, ConfigDict, Field, model_validator

from prime_swarm.libs.environments import load_env
from prime_swarm.protocol.messages import Lease, Prompt, VerifiedCompletion


class PromptSelection(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(
        False, description="Skip prompts whose last pass rate is outside the band."
    )
    unsolved: float = Field(
        0.0, ge=0, le=1, description="A prompt at or below this pass rate is not yet learnable."
    )
    mastered: float = Field(
        1.0, ge=0, le=1, description="A prompt at or above this pass rate is learnt."
    )
    explore: float = Field(
        0.125,
        ge=0,
        le=1,
        description="Probability that a prompt outside the band is leased anyway, so its rate "
        "is measured again as the policy moves.",
    )
    max_skips: int = Field(
        16,
        ge=0,
        le=1024,
        description="Draws skipped per lease before the next is taken whatever its rate (a "
        "pool that has mastered every prompt still leases).",
    )

    @model_validator(mode="after")
    def _band(self) -> PromptSelection:
        if self.unsolved >= self.mastered:
            raise ValueError(f"unsolved {self.unsolved} must be below mastered {self.mastered}")
        return self

    def in_band(self, rate: float | None) -> bool:
        """Whether a prompt with last pass rate `rate` (None: never seen) is worth leasing."""
        return not self.enabled or rate is None or self.unsolved < rate < self.mastered


def prompt_key(env: str, prompt: Prompt) -> str:
    """One key per problem: the environment and the prompt's text (not the task id: two ids of
    one environment may pose the same problem)."""
    text = prompt if isinstance(prompt, str) else json.dumps([m.model_dump() for m in prompt])
    return f"{env}:{hashlib.sha256(text.encode()).hexdigest()[:20]}"


def parse_rate(raw: bytes | str | None) -> float | None:
    """A stored rate, or None where none is (or where something else was written)."""
    if raw is None:
        return None
    try:
        rate = float(raw)
    except ValueError:
        return None
    return rate if 0.0 <= rate <= 1.0 else None


def pass_rate(lease: Lease, completions: list[VerifiedCompletion]) -> tuple[str, float]:
    """An accepted group's prompt key and pass rate (its mean task reward)."""
    task = load_env(lease.env, lease.env_args).task_from_id(lease.task_id)
    rate = sum(c.task_reward for c in completions) / len(completions)
    return prompt_key(lease.env, task.prompt), min(max(rate, 0.0), 1.0)
