"""Environments are found by name through the `prime_swarm.environments` entry-point group; an
unknown, broken or misconfigured one is one clear line, and every service stops on it at start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prime_swarm.libs.environments import EnvLoadError, installed, load_env
from prime_swarm.libs.rollout.recipe import Recipe

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _install_metadata(site: Path, entry_points: str) -> None:
    """What pip writes for an installed distribution: enough for importlib.metadata to find it."""
    info = site / "broken_envs-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-envs\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[prime_swarm.environments]\n{entry_points}\n")


@pytest.fixture
def broken_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "misnamed_env.py").write_text(
        "from prime_swarm.libs.environments.reverse import ReverseEnv\n"
        "def build():\n    return ReverseEnv()\n"
        "def not_an_env():\n    return object()\n"
    )
    _install_metadata(
        tmp_path,
        "gone = no_such_module_here:Env\n"
        "misnamed = misnamed_env:build\n"
        "notenv = misnamed_env:not_an_env\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_the_built_in_environments_register_as_plugins() -> None:
    assert {"reverse", "arith", "code"} <= set(installed())
    assert load_env("arith") is load_env("arith")  # one instance per (name, args)
    narrow = load_env("arith", {"ops": ["+"], "max_operand": 9})
    assert narrow is not load_env("arith")
    assert all("+" in narrow.task_from_id(f"arith/train/{i}").prompt for i in range(20))


@pytest.mark.parametrize(
    ("name", "args", "says"),
    [
        ("nope", None, "unknown environment 'nope'; installed: "),
        (
            "gone",
            None,
            "environment 'gone' (no_such_module_here:Env) does not import: ModuleNotFoundError",
        ),
        ("misnamed", None, "environment 'misnamed' calls itself 'reverse'"),
        ("notenv", None, "environment 'notenv' built a object, not an Env"),
        ("arith", {"max_operand": 0}, "environment 'arith' refused its arguments"),
        ("arith", {"colour": "red"}, "unexpected keyword argument 'colour'"),
    ],
)
def test_a_bad_environment_is_one_clear_error(broken_site, name, args, says) -> None:  # noqa: ANN001
    with pytest.raises(EnvLoadError) as err:
        load_env(name, args)
    assert says in str(err.value)
    assert "\n" not in str(err.value)


def test_the_recipe_refuses_a_bad_environment_naming_the_setting(broken_site) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="does not import"):
        Recipe(env="gone")
    with pytest.raises(ValueError, match="refused its arguments"):
        Recipe(env="arith", env_args={"max_operand": -1})
    assert Recipe(env="arith", env_args={"max_operand": 9}).environment().max_operand == 9


@pytest.mark.parametrize("service", ["orchestrator", "validator", "trainer"])
@pytest.mark.parametrize(
    ("variables", "names"),
    [
        ({"PRIME_RECIPE_ENV": "nope"}, "PRIME_RECIPE_ENV: unknown environment 'nope'"),
        (
            {"PRIME_RECIPE_ENV": "arith", "PRIME_RECIPE_ENV_ARGS": '{"max_operand": 0}'},
            "PRIME_RECIPE_ENV_ARGS: environment 'arith' refused its arguments",
        ),
    ],
)
def test_every_service_stops_at_start_on_a_bad_environment(service, variables, names) -> None:  # noqa: ANN001
    proc = subprocess.run(
        [str(BIN / f"prime-{service}")],
        env={**os.environ, **variables},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0], proc.stderr


def test_environment_code_needs_no_torch() -> None:
    """A validator's environment side (and a plugin importing the SDK) imports no torch."""
    code = (
        "import sys\n"
        "from prime_swarm.libs.environments import load_env\n"
        "for name in ('reverse', 'arith', 'code'):\n"
        "    env = load_env(name)\n"
        "    t = env.task_from_id(f'{name}/train/3')\n"
        "    env.reward(t, t.answer)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=REPO)
