"""A taskset written for the `verifiers` library (its v1 API) run by a pool: a package built in a
temporary folder and installed by pip, loaded by its package name (`PRIME_RECIPE_ENV=verifiers`,
`PRIME_RECIPE_ENV_ARGS={"taskset": ...}`), its chat prompts leased, answered by an `hf` worker,
re-scored by the validator with the taskset's own `@vf.reward` function, and trained on. A
taskset whose reward needs the network, or a runtime, is refused when the pool starts."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from small_pool import pip_install, run_small_pool

from prime_swarm.libs.rollout.recipe import Recipe

pytest.importorskip("verifiers.v1", reason="the verifiers extra is not installed")

STEPS = 2

PACKAGE = '''\
"""Reverse the digits; partial credit per digit (a verifiers v1 taskset)."""

import socket

import verifiers.v1 as vf


class MirrorData(vf.TaskData):
    answer: str


class MirrorTask(vf.Task[MirrorData]):
    @vf.reward
    async def digits(self, task, trace) -> float:
        got = trace.last_reply.strip()
        hits = sum(a == b for a, b in zip(got, task.answer))
        return hits / max(len(task.answer), len(got))


class PhoneTask(MirrorTask):
    @vf.reward
    async def digits(self, task, trace) -> float:
        socket.create_connection(("127.0.0.1", 9), timeout=1)  # asks a server for the score
        return 1.0


class RuntimeTask(MirrorTask):
    @vf.reward
    async def digits(self, task, trace, runtime) -> float:
        return 1.0


class MirrorTaskset(vf.Taskset[MirrorTask]):
    TASK = MirrorTask

    def load(self):
        for i in range(300):
            answer = str(i * 37 % 1000).zfill(3)
            data = MirrorData(prompt=f"rev {answer[::-1]}=", answer=answer)
            yield self.TASK(data, self.config.task)


class PhoneTaskset(MirrorTaskset):
    TASK = PhoneTask


class RuntimeTaskset(MirrorTaskset):
    TASK = RuntimeTask
'''


def _package(root: Path, name: str, cls: str) -> Path:
    src = root / name
    (src / name).mkdir(parents=True)
    (src / "pyproject.toml").write_text(
        textwrap.dedent(f"""\
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{name.replace("_", "-")}"
        version = "0.1.0"
        """)
    )
    (src / name / "tasks.py").write_text(PACKAGE)
    (src / name / "__init__.py").write_text(f"from .tasks import {cls}\n\n__all__ = ['{cls}']\n")
    return src


@pytest.fixture(scope="module")
def taskset_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tasksets")
    site = tmp_path_factory.mktemp("site")
    sources = [
        _package(root, "mirror_taskset", "MirrorTaskset"),
        _package(root, "phone_taskset", "PhoneTaskset"),
        _package(root, "runtime_taskset", "RuntimeTaskset"),
    ]
    pip_install(sources, site)
    return site


@pytest.fixture
def on_path(taskset_site: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(taskset_site))
    monkeypatch.setenv("PYTHONPATH", str(taskset_site))
    return taskset_site


def test_the_tasksets_own_reward_scores_a_reply(on_path: Path) -> None:
    env = Recipe(env="verifiers", env_args={"taskset": "mirror_taskset"}).environment()
    task = env.task_from_id("verifiers/train/5")
    assert [m.role for m in task.prompt] == ["user"]
    assert task.prompt[0].content == f"rev {task.answer[::-1]}="
    assert env.reward(task, task.answer) == pytest.approx(1.0)
    assert env.reward(task, task.answer[:2] + "x") == pytest.approx(2 / 3)
    assert env.reward(task, "nothing") == pytest.approx(0.0)
    # The same task from the same id, every time: a validator re-derives it.
    assert env.task_from_id("verifiers/train/5") == task
    train = {env.task_from_id(f"verifiers/train/{i}").answer for i in range(300)}
    heldout = {env.task_from_id(f"verifiers/heldout/{i}").answer for i in range(300)}
    assert train and heldout and not train & heldout


@pytest.mark.parametrize(
    ("taskset", "says"),
    [
        ("phone_taskset", "its reward needs the network"),
        ("runtime_taskset", "reward 'digits' needs a runtime"),
        ("no_such_taskset", "refused its arguments"),
    ],
)
def test_a_taskset_the_validator_cannot_rerun_is_refused_at_start(on_path, taskset, says) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=says):
        Recipe(env="verifiers", env_args={"taskset": taskset})


# Slow (30 s): a whole pool again. The default suite keeps the taskset's own reward and the
# refusals at start (above) and the whole network in tests/e2e/test_network.py.
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_pool_trains_on_a_verifiers_taskset(
    on_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # The taskset has no systematic mistake to teach, so a full warm start learns its answers
    # outright and every sample scores 1.0 (CI saw 32 of 32): a short one leaves the policy
    # imperfect, so the partial-credit reward has something to grade.
    run = run_small_pool(
        tmp_path_factory.mktemp("run"),
        warm_start_steps=60,
        steps=STEPS,
        groups_per_step=4,
        lease_batch=4,
        eval_tasks=8,
        recipe=Recipe(
            env="verifiers",
            env_args={"taskset": "mirror_taskset"},
            group_size=4,
            max_new_tokens=5,
        ),
    )
    try:
        run.assert_honest()
        run.assert_scored_by("verifiers")
    finally:
        run.net.stop()
