"""reasoning-gym datasets as an environment: tasks re-derived from their ids, disjoint splits,
the dataset's own scoring, and bad arguments refused at start."""

from __future__ import annotations

import pytest

from prime_swarm.libs.environments import EnvLoadError, load_env
from prime_swarm.libs.environments.reasoning_gym import ReasoningGymEnv

pytest.importorskip("reasoning_gym", reason="the reasoning-gym extra is not installed")

ARGS = {"dataset": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": 2, "max_digits": 2}}


def test_a_task_is_a_pure_function_of_its_id() -> None:
    env = load_env("reasoning-gym", ARGS)
    fresh = ReasoningGymEnv(**ARGS)  # another process, another machine: the same task
    for i in (0, 7, 123_456_789):
        tid = f"reasoning-gym/train/{i}"
        assert env.task_from_id(tid) == fresh.task_from_id(tid)
    task = env.task_from_id("reasoning-gym/train/3")
    assert [m.role for m in task.prompt] == ["system", "user"]


def test_train_and_heldout_are_disjoint_items() -> None:
    env = ReasoningGymEnv(**ARGS, size=1000)
    train = [env.task_from_id(f"reasoning-gym/train/{i}").prompt[1].content for i in range(50)]
    held = [env.task_from_id(f"reasoning-gym/heldout/{i}").prompt[1].content for i in range(50)]
    assert train != held
    assert env.task_from_id("reasoning-gym/train/1000") == env.task_from_id(
        "reasoning-gym/train/0"
    ).model_copy(update={"task_id": "reasoning-gym/train/1000"})


def test_the_datasets_own_score() -> None:
    env = ReasoningGymEnv(**ARGS)
    task = env.task_from_id("reasoning-gym/train/11")
    assert env.reward(task, f"<answer>{task.answer}</answer>") == pytest.approx(1.0)
    assert env.reward(task, f"I think <answer> {task.answer} </answer>") == pytest.approx(1.0)
    assert env.reward(task, "<answer>no idea</answer>") == pytest.approx(0.0)
    assert env.reward(task, task.answer) == pytest.approx(1.0)


def test_bad_arguments_are_one_clear_error() -> None:
    with pytest.raises(EnvLoadError, match="refused its arguments.*not registered"):
        load_env("reasoning-gym", {"dataset": "no_such_dataset"})
    with pytest.raises(EnvLoadError, match="refused its arguments"):
        load_env("reasoning-gym", {"dataset": "basic_arithmetic", "config": {"min_terms": 0}})


def test_the_format_score_asks_only_for_the_tags() -> None:
    env = ReasoningGymEnv(**ARGS)
    task = env.task_from_id("reasoning-gym/train/11")
    assert env.format_score(task, ["<answer>wrong</answer>"]) == 1.0  # format, not accuracy
    assert env.format_score(task, [task.answer]) == 0.0
    assert env.format_score(task, ["<answer>", "<answer>1</answer>"]) == 1.0  # the last turn's
    assert ReasoningGymEnv(**ARGS, system_prompt=None).format_score(task, ["x"]) is None


def test_the_format_part_is_weighed_by_the_recipe_and_apart_from_the_task() -> None:
    from prime_swarm.libs.environments.reward import LengthReward, score

    parts = score(0.0, 5, None, LengthReward(), format_score=1.0, format_weight=0.2)
    assert (parts.task, parts.format) == (0.0, pytest.approx(0.2))
    assert parts.total == pytest.approx(0.2)
    assert score(1.0, 5, None, LengthReward(), format_score=None, format_weight=0.2).format == 0
    assert score(1.0, 5, None, LengthReward(), format_score=1.0).total == 1.0  # weight 0: off
