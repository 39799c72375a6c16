import random

import pytest

from prime_swarm.libs.environments import load_env
from prime_swarm.libs.environments.code import FAMILIES, CodeEnv


@pytest.fixture
def env():
    return load_env("code")


def _by_family(env):
    """One task per family (the first met), so each kind of problem is exercised once."""
    tasks = {}
    for split in ("train", "heldout"):
        for t in env.sample_tasks(0, 300, split):
            tasks.setdefault(env._spec(*env.parse_task_id(t.task_id))[0], t)
    assert set(tasks) == set(FAMILIES)
    return tasks


def test_task_is_rederived_from_its_id(env):
    for t in env.sample_tasks(2, 30, "train") + env.sample_tasks(2, 10, "heldout"):
        assert env.task_from_id(t.task_id) == t
        assert load_env(t.task_id.split("/")[0]) is env  # the id names its environment
        assert env.cases(t.task_id) == env.cases(t.task_id)
        assert t.prompt.startswith("# f(") and t.prompt.endswith("\n")
        assert len(t.prompt) + len(t.answer) < 56  # fits the tiny model's 64-token context
        assert len(t.answer) <= env.max_answer_chars
    assert env.sample_tasks(0, 20, "train") == env.sample_tasks(0, 20, "train")


def test_splits_are_disjoint_by_problem(env):
    train = {t.prompt for t in env.sample_tasks(0, 2000, "train")}
    heldout = {t.prompt for t in env.sample_tasks(0, 500, "heldout")}
    assert train.isdisjoint(heldout)
    assert len(heldout) == len(env.specs["heldout"]) >= 5
    assert len(train) == len(env.specs["train"])
    assert set(env.specs["train"]) | set(env.specs["heldout"]) == {
        (fam, k) for fam, family in FAMILIES.items() for k in family.ks
    }


def test_correct_solutions_score_one(env):
    tasks = _by_family(env)
    for t in tasks.values():
        assert env.reward(t, t.answer) == 1.0, t
    # The canonical answer is not the only one: any correct f will do.
    assert env.reward(tasks["rev"], "def f(s):\n    return ''.join(reversed(s))\n") == 1.0


def test_wrong_solutions_score_below_one(env):
    rng = random.Random(0)
    scores = [env.reward(t, env.noisy_answer(t, rng, 1.0)) for t in _by_family(env).values()]
    assert all(0.0 <= s < 1.0 for s in scores)
    t = next(iter(_by_family(env).values()))
    assert env.noisy_answer(t, rng, 0.0) == t.answer


@pytest.mark.parametrize(
    "completion",
    [
        "",
        "def f(x) return",
        "f = 3",
        # Correct, but tries to escape on the side: anything refused scores 0, not partial.
        "import os\nos.system('true')\n{answer}",
        "import socket\n{answer}",
        "{answer}\nopen('/tmp/prime-code-env-escape', 'w').write('x')",
        # A forged report, with no way of knowing the expected values.
        "import os\nreport = '\\n\\x1esandbox-result:' + ascii([('ok', 'x')] * 5) + '\\n'"
        "\nos.write(1, report.encode())\nos._exit(0)",
    ],
)
def test_broken_or_malicious_solutions_score_zero(env, completion):
    t = _by_family(env)["add"]
    assert env.reward(t, completion.format(answer=t.answer)) == 0.0


def test_max_answer_chars_fits_every_answer(env):
    tasks = env.sample_tasks(0, 2000, "train") + env.sample_tasks(0, 500, "heldout")
    assert len({t.prompt for t in tasks}) == len(env.specs["train"]) + len(env.specs["heldout"])
    assert max(len(t.answer) for t in tasks) == env.max_answer_chars
    assert isinstance(env, CodeEnv)
