"""An environment from outside the project: a package written to a temporary folder, built and
installed there by pip like any third-party package, found through the `prime_swarm.environments`
entry-point group, and run end to end by a whole local pool (leases, an `hf` worker, the
validator re-deriving its chat-formatted prompts and re-scoring with the plugin's own reward,
the trainer) without one line of the project naming it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from small_pool import pip_install, run_small_pool

from prime_swarm.libs.rollout.recipe import Recipe
from prime_swarm.protocol.messages import Lease

STEPS = 2

PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "swarm-mirror-env"
version = "0.1.0"

[project.entry-points."prime_swarm.environments"]
mirror = "swarm_mirror_env:MirrorEnv"
"""

MODULE = '''\
"""Write the digits back in reverse, asked in chat messages; partial credit per digit."""

import random

from prime_swarm.libs.environments import Env, Task
from prime_swarm.libs.environments.base import hash_int


class MirrorEnv(Env):
    name = "mirror"

    def __init__(self, length: int = 4) -> None:
        if not 1 <= length <= 8:
            raise ValueError("length must be 1..8")
        self.length = length
        self.max_answer_chars = length

    def task_from_id(self, task_id: str) -> Task:
        split, index = self.parse_task_id(task_id)
        h = hash_int(self.name, split, index, self.length)
        answer = str(h % 10**self.length).zfill(self.length)
        messages = [{"role": "user", "content": f"rev {answer[::-1]}="}]
        return Task(task_id=task_id, prompt=messages, answer=answer)

    def reward(self, task: Task, completion: str) -> float:
        got = completion.strip()
        hits = sum(a == b for a, b in zip(got, task.answer))
        return hits / max(len(task.answer), len(got))

    def noisy_answer(self, task: Task, rng: random.Random, error_rate: float) -> str:
        # A habit to unlearn, as the contract asks: the warm start on perfect answers could
        # leave every sampled reward at 1.0 and nothing for the pool to vary or learn.
        return "".join(str((int(c) + 1) % 10) if rng.random() < error_rate else c
                       for c in task.answer)
'''


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package built and installed by pip into a folder of its own (never into the venv)."""
    src = tmp_path_factory.mktemp("swarm-mirror-env")
    (src / "pyproject.toml").write_text(PYPROJECT)
    (src / "swarm_mirror_env.py").write_text(textwrap.dedent(MODULE))
    site = tmp_path_factory.mktemp("site")
    pip_install([src], site)
    return site


# Slow (35 s): a whole pool again. The default suite keeps the plugin's discovery and its leases
# (below) and the whole network in tests/e2e/test_network.py.
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_pool_runs_on_an_installed_environment_package(
    plugin_site: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This process (the launcher, its held-out evaluation) and every service it starts find the
    # package the way any installed package is found.
    monkeypatch.syspath_prepend(str(plugin_site))
    monkeypatch.setenv("PYTHONPATH", str(plugin_site))
    run = run_small_pool(
        tmp_path_factory.mktemp("run"),
        steps=STEPS,
        groups_per_step=4,
        lease_batch=4,
        eval_tasks=8,
        recipe=Recipe(env="mirror", env_args={"length": 3}, group_size=4, max_new_tokens=5),
    )
    try:
        run.assert_honest()
        run.assert_scored_by("mirror")
    finally:
        run.net.stop()


def test_leases_carry_the_plugin_and_its_arguments(plugin_site: Path, monkeypatch) -> None:  # noqa: ANN001
    """What a worker and a validator build the environment from: name and arguments, in the
    lease, with the chat-formatted prompt."""
    monkeypatch.syspath_prepend(str(plugin_site))
    recipe = Recipe(env="mirror", env_args={"length": 3})
    task = recipe.environment().task_from_id("mirror/train/7")
    lease = Lease.model_validate(
        {
            "lease_id": "l",
            "worker": "0x" + "ab" * 20,
            "pool_id": 1,
            "work_id": 0,
            "env": recipe.env,
            "env_args": recipe.env_args,
            "task_id": task.task_id,
            "prompt": task.prompt,
            "group_size": 2,
            "sampling": {"temperature": 1.0, "max_new_tokens": 4},
            "seed": 1,
            "min_policy_version": 0,
            "expires_at": 0.0,
        }
    )
    again = Lease.model_validate_json(lease.model_dump_json())
    assert again.env_args == {"length": 3}
    assert [m.role for m in again.prompt] == ["user"]
    assert len(task.answer) == 3
