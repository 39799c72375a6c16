"""The real model's task: two-number addition asked in words, scored on the reply's last integer."""

from __future__ import annotations

import pytest

from prime_swarm.libs.environments import load_env
from prime_swarm.libs.environments.addition import AdditionEnv


def _operands(env: AdditionEnv, split: str, n: int) -> set[tuple[int, int]]:
    pairs = set()
    for t in env.sample_tasks(7, n, split):  # type: ignore[arg-type]
        words = t.prompt[0].content.split()
        a, b = int(words[2]), int(words[4].rstrip("?"))
        assert env.low <= a <= env.high and env.low <= b <= env.high
        assert t.answer == str(a + b)
        pairs.add((min(a, b), max(a, b)))
    return pairs


def test_tasks_are_chat_messages_rederived_from_their_id() -> None:
    env = load_env("addition")
    for t in env.sample_tasks(0, 20, "train"):
        assert t == env.task_from_id(t.task_id)
        assert t.prompt[0].role == "user"


def test_train_and_heldout_share_no_problem_in_either_order() -> None:
    env = AdditionEnv()
    assert not _operands(env, "train", 400) & _operands(env, "heldout", 200)


@pytest.mark.parametrize(
    ("reply", "reward"),
    [
        ("64", 1.0),
        ("23 + 41 = 64.", 1.0),
        ("The answer is 64", 1.0),
        ("64, not 65", 0.0),  # the last integer counts
        ("23 + 41 =", 0.0),
        ("", 0.0),
        ("6 4", 0.0),
    ],
)
def test_the_last_integer_is_the_answer(reply: str, reward: float) -> None:
    env = AdditionEnv()
    task = env.task_from_id(env.task_id("train", 0)).model_copy(update={"answer": "64"})
    assert env.reward(task, reply) == reward


@pytest.mark.parametrize("args", [{"low": 5, "high": 4}, {"heldout_percent": 0}])
def test_bad_arguments_are_refused(args: dict) -> None:
    with pytest.raises(ValueError):
        AdditionEnv(**args)
