import random

import pytest

from prime_swarm.libs.environments import EnvLoadError, Task, load_env


@pytest.fixture
def env():
    return load_env("reverse")


def _task(answer: str) -> Task:
    return Task(task_id="reverse/train/0", prompt=f"rev {answer[::-1]}=", answer=answer)


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("54321", 1.0),
        (" 54321 ", 1.0),  # surrounding whitespace is not a format error
        ("54300", 0.6),
        ("12345", 0.2),  # the echo gets only the middle digit
        ("5432", 0.8),  # too short: 4 right out of max(4, 5)
        ("543210", 5 / 6),  # too long: 5 right out of max(6, 5)
        ("54a21", 0.0),  # non-digit: broken format
        ("", 0.0),
    ],
)
def test_reward_examples(env, completion, expected):
    assert env.reward(_task("54321"), completion) == pytest.approx(expected)


def test_train_and_heldout_are_disjoint_and_deterministic(env):
    train = env.sample_tasks(0, 3000, "train") + env.sample_tasks(1, 3000, "train")
    heldout = env.sample_tasks(0, 500, "heldout")
    assert {t.answer for t in train}.isdisjoint({t.answer for t in heldout})
    assert env.sample_tasks(0, 50, "train") == env.sample_tasks(0, 50, "train")
    assert env.sample_tasks(0, 50, "train") != env.sample_tasks(1, 50, "train")
    assert all(env.split_of(t.answer[::-1]) == "heldout" for t in heldout)


def test_task_is_rederived_from_its_id(env):
    for t in env.sample_tasks(5, 20, "heldout") + env.sample_tasks(5, 20, "train"):
        assert env.task_from_id(t.task_id) == t
        assert load_env(t.task_id.split("/")[0]) is env  # the id names its environment
        assert t.prompt == f"rev {t.answer[::-1]}="
        assert env.min_len <= len(t.answer) <= env.max_len


def test_bad_ids_are_refused(env):
    for bad in ("reverse/test/1", "other/train/1", "reverse/train/x", "reverse/train"):
        with pytest.raises(ValueError):
            env.task_from_id(bad)
    with pytest.raises(EnvLoadError, match="unknown environment 'nope'; installed: .*reverse"):
        load_env("nope")


def test_noisy_answer_injects_the_systematic_error(env):
    task = _task("09125")
    rng = random.Random(0)
    assert env.noisy_answer(task, rng, 0.0) == "09125"
    assert env.noisy_answer(task, rng, 1.0) == "10236"  # each digit -> its successor, 9 -> 0
    mixed = [env.noisy_answer(task, rng, 0.5) for _ in range(200)]
    assert all(len(m) == 5 for m in mixed) and len(set(mixed)) > 10
