"""The REPL environments' seeded problems (libs/environments/problems.py) are pinned: results,
task lists and recorded runs name tasks by id, so an id must give the same problem, prompt and
answer in every version. A change that fails here changes every python-tool and rlm task."""

from __future__ import annotations

import hashlib

import pytest

from prime_swarm.libs.environments.problems import SeededProblemEnv
from prime_swarm.libs.environments.python_tool import PythonToolEnv
from prime_swarm.libs.environments.rlm import RLMEnv


@pytest.mark.parametrize(
    ("task_id", "problem", "first_line", "answer"),
    [
        (
            "python-tool/train/0",
            ("mul_sub", (("a", 69), ("b", 24), ("c", 20), ("d", 42))),
            "What is 69*24-20*42?",
            "816",
        ),
        (
            "python-tool/train/7",
            ("crates", (("a", 29), ("n", 45), ("s", 243))),
            "A crate holds 29 apples. A shop buys 45 crates and sells 243 apples. How many apples "
            "does it have left?",
            "1062",
        ),
        (
            "python-tool/heldout/0",
            ("range_sum", (("a", 82), ("b", 994))),
            "What is the sum of all the integers from 82 to 994?",
            "491194",
        ),
        (
            "rlm/train/0",
            ("count_above", 192, 234303240272952),
            "`context` is a Python list of 1000 integers from 0 to 999. It is not shown here: it "
            "exists only in a Python REPL. Question: How many entries of `context` are greater "
            "than 192?",
            "799",
        ),
        (
            "rlm/train/7",
            ("city_total", "Doha", 223130951836306),
            "`context` is a Python str of 1000 lines `order_id,city,amount` (15745 chars, no "
            "header). It is not shown here: it exists only in a Python REPL. Question: What is "
            "the total amount of the orders from Doha?",
            "28840",
        ),
        (
            "rlm/heldout/0",
            ("count_above", 417, 240669116904148),
            "`context` is a Python list of 1000 integers from 0 to 999. It is not shown here: it "
            "exists only in a Python REPL. Question: How many entries of `context` are greater "
            "than 417?",
            "578",
        ),
    ],
)
def test_pinned_tasks(task_id: str, problem: tuple, first_line: str, answer: str) -> None:
    env: SeededProblemEnv = PythonToolEnv() if task_id.startswith("python-tool") else RLMEnv()
    assert env.problem(*env.parse_task_id(task_id)) == problem
    task = env.task_from_id(task_id)
    assert task.prompt.split("\n")[0] == first_line
    assert task.answer == answer


def _digest(env: PythonToolEnv | RLMEnv) -> str:
    """One hash over the first 50 tasks of each split: ids, prompts, answers (and rlm's inputs)."""
    h = hashlib.sha256()
    for split in ("train", "heldout"):
        for task in env.sample_tasks(0, 25, split) + [
            env.task_from_id(env.task_id(split, i)) for i in range(25)
        ]:
            setup = env.setup(task) if isinstance(env, RLMEnv) else ""
            h.update(repr((task.task_id, task.prompt, task.answer, setup)).encode())
    return h.hexdigest()


def test_pinned_task_stream() -> None:
    assert _digest(PythonToolEnv()) == (
        "779323d66000cd39fbe761df6fc9b8759d980ed6eba5aac818fa45502bc0323a"
    )
    assert _digest(RLMEnv(size=50)) == (
        "ee3b439db9b2e006dadd74f007665a9647d056ddf77a5162230042d41c52c2b5"
    )
