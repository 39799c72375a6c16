"""An environment's determinism, checked where the pool starts (libs/environments/determinism.py):
every built-in environment passes; a plugin whose replies carry the clock, `hash()` or a call
counter stops the orchestrator with one line naming it; and the validator's second look tells
an environment that disagrees with itself from one that does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import unsteady_envs
from echo_env import EchoCount, registered

from prime_swarm.libs.environments.determinism import (
    Episode,
    check_environments,
    second_look,
    start_job,
    transcript,
)
from prime_swarm.services.orchestrator import cli as orchestrator_cli

BUILT_IN = ("reverse", "arith", "code", "addition", "guess-number", "python-tool", "rlm")
ADDR = "0x" + "11" * 20


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    unsteady_envs.install(tmp_path / "site", monkeypatch)


def test_the_built_in_environments_are_deterministic() -> None:
    """All of them at once, as a recipe's mixture is checked: one fresh process plays them
    while this one does (what a pool start pays: a few tenths of a second each)."""
    started = time.perf_counter()
    assert check_environments([(name, None) for name in BUILT_IN]) is None
    assert time.perf_counter() - started < 30


def test_the_start_check_plays_several_turns_of_replies_and_scores() -> None:
    """Multi-turn environments are played past their first reply, tool calls included, so that
    a reply that depends on anything but the task and the turns has turns to show in."""
    guess = transcript(start_job("guess-number"))
    assert any(" turn 2 of " in where for where in guess)
    assert sum(where.endswith("replied") for where in guess) >= 12
    assert any(where.startswith("seed 1 sampled heldout") for where in guess)
    tool = transcript(start_job("python-tool"))
    assert any("Output" in said for where, said in tool.items() if where.endswith("replied"))
    assert sum(" scored " in where for where in tool) == 4 * 5  # 4 tasks, 5 episodes each


@pytest.mark.parametrize(
    ("name", "where"),
    [
        ("clock-env", "in one process and"),
        ("hash-env", "in one process and"),  # another PYTHONHASHSEED in the fresh process
        ("counting-env", "in one process and"),  # the fresh one plays in the other order
    ],
)
def test_a_plugin_that_is_not_deterministic_is_named_in_one_line(
    plugins: None, name: str, where: str
) -> None:
    line = check_environments([("reverse", None), (name, None)])
    assert line is not None and "\n" not in line
    assert line.startswith(f"environment {name!r} is not deterministic: task {name}/")
    assert " replied '<" in line and where in line and line.endswith("in another")


def test_a_hash_seed_fixed_for_the_pool_is_not_the_fresh_process_s(plugins: None) -> None:
    """A service started with PYTHONHASHSEED set (some images fix it) still gets a fresh
    process with another seed: else `hash()` in a reply would agree in both and pass."""
    code = "from prime_swarm.libs.environments.determinism import check_environments as c\n"
    code += "print(c([('hash-env', None)]))"
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.startswith("environment 'hash-env' is not deterministic"), out.stderr


def test_the_deterministic_plugin_passes(plugins: None) -> None:
    assert check_environments([("echo-count", None)]) is None


def test_an_environment_a_fresh_process_cannot_play_is_named() -> None:
    """Registered in this process only, not installed: the fresh process cannot build it."""
    with registered(EchoCount()):
        line = check_environments([("echo-count", None)])
    assert line is not None and "\n" not in line
    assert line.startswith("environment 'echo-count' could not be played in a second process")
    assert "unknown environment 'echo-count'" in line


def _start(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, **recipe: str) -> str:
    """`prime-orchestrator` started with the recipe's variables: what it printed on stderr
    before exiting 2, or "served" when it went on to serve."""
    for key, value in recipe.items():
        monkeypatch.setenv(f"PRIME_RECIPE_{key.upper()}", value)
    import uvicorn

    from prime_swarm.libs.observability import logs

    # What serving would change in this process (logging, a signal handler) is left alone.
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: print("served"))
    monkeypatch.setattr(logs, "setup_logging", lambda *a, **k: None)
    monkeypatch.setattr(orchestrator_cli, "hangup_as_terminate", lambda: None)
    try:
        orchestrator_cli.main(["--pool", "1", "--ledger", ADDR])
    except SystemExit as exc:
        assert exc.code == 2
        return capsys.readouterr().err
    return capsys.readouterr().out.strip()


def test_the_orchestrator_does_not_start_on_it(
    plugins: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    err = _start(monkeypatch, capsys, env="clock-env")
    (line,) = err.strip().splitlines()
    assert line.startswith("prime-orchestrator: environment 'clock-env' is not deterministic: ")
    # In a mixture, the one that is not deterministic is named.
    mixture = json.dumps([{"env": "addition", "weight": 2}, {"env": "hash-env"}])
    err = _start(monkeypatch, capsys, env="reverse", mixture=mixture)
    (line,) = err.strip().splitlines()
    assert line.startswith("prime-orchestrator: environment 'hash-env' is not deterministic: ")


def test_the_orchestrator_starts_on_a_deterministic_environment(
    plugins: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    mixture = json.dumps([{"env": "guess-number"}, {"env": "echo-count"}])
    assert _start(monkeypatch, capsys, mixture=mixture) == "served"


# --------------------------------------------------------------------------- the second look
def _episodes(name: str) -> list[Episode]:
    task = f"{name}/train/0"
    return [Episode(task, f"completion {i}", ("ab", "c" * i, "d")) for i in range(4)]


def test_the_second_look_finds_a_deterministic_environment_in_agreement(plugins: None) -> None:
    assert second_look("echo-count", None, _episodes("echo-count")) is None


@pytest.mark.parametrize(
    ("name", "between"),
    [
        ("clock-env", "in one call and"),  # two replays in this process already disagree
        ("counting-env", "in one call and"),
        ("hash-env", "in this process and"),  # only a fresh process shows it
    ],
)
def test_the_second_look_finds_an_environment_that_disagrees_with_itself(
    plugins: None, name: str, between: str
) -> None:
    said = second_look(name, None, _episodes(name))
    assert said is not None and "\n" not in said
    assert said.startswith(f"environment {name!r} is not deterministic: task {name}/train/0 ")
    assert between in said
