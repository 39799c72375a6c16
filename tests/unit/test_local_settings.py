"""`prime-swarm up --model smollm2`: one flag brings the real model's task and shape, and anything
set explicitly beside it still wins."""

from __future__ import annotations

import pytest

from prime_swarm.deploy.local.cli import main
from prime_swarm.deploy.local.settings import (
    ENV_PRESETS,
    REAL_MODEL_PRESET,
    ChaosSettings,
    LocalNetworkSettings,
)


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
