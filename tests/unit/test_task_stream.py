"""The pool's task stream (libs/rollout/task_stream.py): a pure function of (seed, index) that
draws environments by weight and keeps to the train split, a finite train set or a task list."""

from collections import Counter

from prime_swarm.libs.rollout.recipe import EnvShare, Recipe
from prime_swarm.libs.rollout.task_stream import task_at

RECIPE = Recipe(mixture=[EnvShare(env="reverse", weight=3.0), EnvShare(env="arith", weight=1.0)])
ENVS = RECIPE.environments()


def test_the_same_index_draws_the_same_task_and_another_seed_another_stream():
    a = [task_at(RECIPE, ENVS, 7, i)[1].task_id for i in range(50)]
    assert a == [task_at(RECIPE, ENVS, 7, i)[1].task_id for i in range(50)]
    assert a != [task_at(RECIPE, ENVS, 8, i)[1].task_id for i in range(50)]


def test_environments_are_drawn_by_weight_from_the_train_split():
    drawn = [task_at(RECIPE, ENVS, 0, i) for i in range(4000)]
    counts = Counter(share.env for share, _ in drawn)
    assert abs(counts["reverse"] / 4000 - 0.75) < 0.03
    for share, task in drawn:
        assert task.task_id.startswith(f"{share.env}/train/")


def test_train_tasks_bounds_the_prompts_and_a_task_list_replaces_the_split():
    bounded = {task_at(RECIPE, ENVS, 0, i, train_tasks=5)[1].task_id for i in range(500)}
    assert len(bounded) == 10  # five per environment, every one drawn
    listed = {"arith": ["arith/train/41", "arith/train/42"]}
    ids = {task_at(RECIPE, ENVS, 0, i, task_lists=listed)[1].task_id for i in range(500)}
    assert {i for i in ids if i.startswith("arith/")} == set(listed["arith"])
