"""Live prompt selection's rule (libs/rollout/selection.py): which prompts are worth a lease,
one key per problem, rates read back defensively."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from prime_swarm.libs.environments import load_env
from prime_swarm.libs.rollout.selection import PromptSelection, parse_rate, prompt_key
from prime_swarm.protocol.messages import ChatMessage


def test_the_band_is_open_at_both_ends() -> None:
    s = PromptSelection(enabled=True, unsolved=0.0, mastered=1.0)
    assert s.in_band(None)  # never seen: leased, so it gets a rate
    assert s.in_band(0.125) and s.in_band(0.875)
    assert not s.in_band(0.0) and not s.in_band(1.0)
    wide = PromptSelection(enabled=True, unsolved=0.2, mastered=0.9)
    assert not wide.in_band(0.2) and wide.in_band(0.25) and not wide.in_band(0.95)


def test_off_leases_everything() -> None:
    assert PromptSelection(enabled=False).in_band(0.0)
    assert PromptSelection(enabled=False).in_band(1.0)


def test_an_empty_band_is_refused() -> None:
    with pytest.raises(ValidationError, match="must be below"):
        PromptSelection(unsolved=0.5, mastered=0.5)
    with pytest.raises(ValidationError):
        PromptSelection(explore=1.5)


def test_one_key_per_problem_not_per_task_id() -> None:
    env = load_env("addition", {"low": 1, "high": 2})
    tasks = [env.task_from_id(env.task_id("train", i)) for i in range(40)]
    by_text: dict[str, set[str]] = {}
    for t in tasks:
        by_text.setdefault(t.prompt[0].content, set()).add(prompt_key("addition", t.prompt))
    assert all(len(keys) == 1 for keys in by_text.values())  # same problem, same key
    assert len({next(iter(k)) for k in by_text.values()}) == len(by_text)  # others differ
    msg = [ChatMessage(role="user", content="What is 1 + 1?")]
    assert prompt_key("a", msg) != prompt_key("b", msg)  # environments never share a key
    assert prompt_key("a", "rev ab=") != prompt_key("a", "rev ba=")


@pytest.mark.parametrize(
    ("raw", "rate"),
    [(None, None), (b"0.5", 0.5), ("1", 1.0), (b"nan", None), (b"2", None), (b"x", None)],
)
def test_a_stored_rate_is_read_defensively(raw: bytes | str | None, rate: float | None) -> None:
    assert parse_rate(raw) == rate
