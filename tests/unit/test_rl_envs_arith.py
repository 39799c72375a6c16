import random
import re

import pytest

from prime_swarm.libs.environments import Task, load_env
from prime_swarm.libs.environments.arith import ArithEnv

PROMPT = re.compile(r"^(\d+)([+*-])(\d+)=$")


@pytest.fixture
def env():
    return load_env("arith")


def _solve(prompt: str) -> str:
    a, op, b = PROMPT.fullmatch(prompt).groups()
    a, b = int(a), int(b)
    return str(a + b if op == "+" else a - b if op == "-" else a * b)


def _task(prompt: str) -> Task:
    return Task(task_id="arith/train/0", prompt=prompt, answer=_solve(prompt))


def test_task_is_rederived_from_its_id(env):
    tasks = env.sample_tasks(3, 200, "train") + env.sample_tasks(3, 50, "heldout")
    for t in tasks:
        assert env.task_from_id(t.task_id) == t
        assert load_env(t.task_id.split("/")[0]) is env  # the id names its environment
        assert t.answer == _solve(t.prompt)
        assert len(t.prompt) <= 7  # "99+99=": a short prompt for a 64-token context
    assert env.sample_tasks(0, 50, "train") == env.sample_tasks(0, 50, "train")
    assert env.sample_tasks(0, 50, "train") != env.sample_tasks(1, 50, "train")
    assert {PROMPT.fullmatch(t.prompt)[2] for t in tasks} == {"+", "-", "*"}


def _key(prompt: str) -> tuple[str, int, int]:
    a, op, b = PROMPT.fullmatch(prompt).groups()
    a, b = int(a), int(b)
    return (op, min(a, b), max(a, b)) if op in "+*" else (op, a, b)


def test_splits_are_disjoint_up_to_commutativity(env):
    train = env.sample_tasks(0, 3000, "train") + env.sample_tasks(1, 3000, "train")
    heldout = env.sample_tasks(0, 500, "heldout")
    # `7+12` held out while `12+7` is trained on would leak, so keys sort commutative operands.
    assert {_key(t.prompt) for t in train}.isdisjoint({_key(t.prompt) for t in heldout})
    assert all(env.split_of(*_key(t.prompt)) == "heldout" for t in heldout)
    assert len({t.prompt for t in heldout}) > 200  # many distinct held-out problems


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("19", 1.0),
        (" 19\n", 1.0),  # surrounding whitespace is not a format error
        ("18", 0.0),
        ("20", 0.0),
        ("019", 0.0),
        ("19.0", 0.0),
        ("+19", 0.0),
        ("1 9", 0.0),
        ("19 20", 0.0),
        ("19=", 0.0),
        ("12+7=19", 0.0),
        ("nineteen", 0.0),
        ("", 0.0),
        ("\x00", 0.0),
    ],
)
def test_reward_is_exact_match(env, completion, expected):
    assert env.reward(_task("12+7="), completion) == expected


def test_bounds_and_max_answer_chars(env):
    tasks = env.sample_tasks(7, 3000, "train")
    assert all(not t.answer.startswith("-") for t in tasks)  # no negatives by default
    assert max(len(t.answer) for t in tasks) <= env.max_answer_chars == len("198")
    for t in tasks:
        a, op, b = PROMPT.fullmatch(t.prompt).groups()
        bound = env.max_factor if op == "*" else env.max_operand
        assert 0 <= int(a) <= bound and 0 <= int(b) <= bound

    negative = ArithEnv(name="neg", ops=("-",), max_operand=9, allow_negative=True)
    answers = {t.answer for t in negative.sample_tasks(0, 500, "train")}
    assert any(a.startswith("-") for a in answers)
    assert negative.max_answer_chars == 2 == max(len(a) for a in answers)  # "-9"
    assert ArithEnv(name="mul", ops=("*",), max_factor=12).max_answer_chars == 3  # "144"
    assert ArithEnv(name="add", ops=("+",), max_operand=9).max_answer_chars == 2  # "18"
    with pytest.raises(ValueError):
        ArithEnv(ops=("/",))


def test_bad_ids_are_refused(env):
    for bad in ("arith/test/1", "reverse/train/1", "arith/train/x", "arith/train"):
        with pytest.raises(ValueError):
            env.task_from_id(bad)


def test_noisy_answer_is_off_by_one_in_the_last_digit(env):
    rng = random.Random(0)
    assert env.noisy_answer(_task("12+7="), rng, 0.0) == "19"
    assert env.noisy_answer(_task("12+7="), rng, 1.0) == "10"  # 9 wraps to 0, no carry
    assert env.noisy_answer(_task("6*7="), rng, 1.0) == "43"
    assert env.noisy_answer(_task("5-5="), rng, 1.0) == "1"
    mixed = [env.noisy_answer(_task("6*7="), rng, 0.5) for _ in range(400)]
    assert set(mixed) == {"42", "43"} and 120 < mixed.count("43") < 280
    assert env.reward(_task("6*7="), "43") == 0.0
