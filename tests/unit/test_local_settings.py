"""`prime-swarm up --model smollm2`: one flag brings the real model's task and shape, and anything
set explicitly beside it still wins."""

from __future__ import annotations

import pytest

from prime_swarm.deploy.local.cli import main
from prime_swarm.deploy.local.settings import (
    ENV_PRESETS,
    REAL_MODEL_PRESET,
    REAL_MODEL_WARM_START,
    ChaosSettings,
    LocalNetworkSettings,
)
from prime_swarm.libs.rl.defaults import WARM_START


def test_the_tiny_default_is_untouched() -> None:
    s = LocalNetworkSettings()
    assert s.model == "tiny" and s.recipe.env == "reverse" and s.filter_zero_variance


def test_smollm2_brings_its_task_and_shape() -> None:
    s = LocalNetworkSettings(model="smollm2")
    assert s.recipe.env == "addition" and s.recipe.max_new_tokens == 24
    assert s.worker_backends == ["vllm"] and not s.filter_zero_variance
    assert s.steps == REAL_MODEL_PRESET["steps"] and s.lr == REAL_MODEL_PRESET["lr"]
    task = s.recipe.environment().sample_tasks(0, 1, "train")[0]
    assert task.prompt[0].content.endswith("Reply with just the number.")


def test_explicit_settings_win_over_the_preset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIME_RECIPE_MAX_NEW_TOKENS", "32")
    monkeypatch.setenv("PRIME_UP_STEPS", "3")
    s = LocalNetworkSettings(model="smollm2", worker_backends=["hf"])
    assert (s.steps, s.worker_backends, s.recipe.max_new_tokens) == (3, ["hf"], 32)
    assert s.recipe.env == "addition"  # what was not set still comes from the preset


def test_chaos_keeps_its_own_step_cap_on_the_real_model() -> None:
    s = ChaosSettings(model="smollm2")
    assert s.steps == ChaosSettings.model_fields["steps"].default
    assert s.recipe.env == "addition" and s.worker_backends == ["vllm"]


def test_an_unknown_model_is_one_line_naming_the_flag(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["up", "--model", "gpt5"])
    assert exc.value.code == 2
    assert "--model" in capsys.readouterr().err


def test_env_names_the_recipes_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    s = LocalNetworkSettings(env="guess-number")
    assert s.recipe.env == "guess-number" and s.steps == ENV_PRESETS["guess-number"]["steps"]
    assert s.lr == ENV_PRESETS["guess-number"]["lr"]
    assert LocalNetworkSettings(env="guess-number", steps=5).steps == 5  # a flag wins
    # Over the variable and over the real model's preset, whose other fields stay.
    monkeypatch.setenv("PRIME_RECIPE_ENV", "arith")
    s = LocalNetworkSettings(model="smollm2", env="guess-number")
    assert s.recipe.env == "guess-number" and s.recipe.max_new_tokens == 24


def test_an_unknown_env_is_one_line_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["up", "--env", "no-such-env"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--env" in err[0] and "unknown environment 'no-such-env'" in err[0]


def test_env_args_are_checked_against_the_env_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's new user: arguments for reasoning-gym in the variable, the environment by
    flag. They were checked against the default environment before --env applied."""
    monkeypatch.setenv("PRIME_RECIPE_ENV_ARGS", '{"dataset": "basic_arithmetic", "size": 50}')
    s = LocalNetworkSettings(model="smollm2", env="reasoning-gym")
    assert s.recipe.env == "reasoning-gym"
    assert s.recipe.env_args == {"dataset": "basic_arithmetic", "size": 50}
    assert s.recipe.max_new_tokens == 24  # the rest of the preset stays
    monkeypatch.delenv("PRIME_RECIPE_ENV_ARGS")
    s = LocalNetworkSettings(env="reasoning-gym", env_args={"dataset": "basic_arithmetic"})
    assert s.recipe.env_args == {"dataset": "basic_arithmetic"}


def test_env_args_for_another_env_are_one_line_naming_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["up", "--env", "reverse", "--env-args", '{"dataset": "x"}'])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "environment 'reverse' refused its arguments" in err[0]


def test_a_mixture_by_flag() -> None:
    mix = [{"env": "reverse", "weight": 2}, {"env": "arith"}]
    s = LocalNetworkSettings(mixture=mix, select_prompts=True)
    assert [(x.env, x.weight) for x in s.recipe.shares()] == [("reverse", 2.0), ("arith", 1.0)]
    assert s.recipe.selection.enabled and s.recipe.env_vars()["PRIME_RECIPE_MIXTURE"]
    assert not LocalNetworkSettings().recipe.selection.enabled


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--env", "arith", "--mixture", '[{"env": "reverse"}]'], "give one"),
        (["--mixture", '[{"env": "reverse"}, {"env": "reverse"}]'], "named twice"),
        (["--mixture", '[{"env": "nope"}]'], "unknown environment 'nope'"),
        (["--mixture", '[{"env": "reverse", "weight": 0}]'], "greater than 0"),
    ],
)
def test_a_bad_mixture_is_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["up", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_a_new_task_is_one_flag_from_a_warm_start_and_a_format_reward() -> None:
    """SmolLM2 takes no warm start unless asked; asked, it gets one on the environment's
    demonstrations at a pretrained model's rate. The format reward is a recipe setting."""
    assert LocalNetworkSettings(model="smollm2").warm_start_steps == 0
    s = LocalNetworkSettings(model="smollm2", warm_start_steps=40, format_reward=0.2)
    assert s.warm_start_steps == 40 and s.recipe.format_reward == pytest.approx(0.2)
    assert LocalNetworkSettings().recipe.format_reward == 0.0
    assert REAL_MODEL_WARM_START["lr"] < WARM_START.lr / 10
