"""The multi-turn environments: guess-number (a game with feedback), python-tool and rlm (replies
are a sandboxed REPL's output). A validator replays every episode on the claimed turns, so each
reply must be a pure function of (task, turns): the same twice, and from a fresh instance."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from prime_swarm.libs.environments import Env, Task, load_env
from prime_swarm.libs.environments.guess_number import GuessNumberEnv
from prime_swarm.libs.environments.python_tool import NO_OUTPUT, PythonToolEnv, code_of
from prime_swarm.libs.environments.rlm import FAMILIES as RLM_FAMILIES
from prime_swarm.libs.environments.rlm import RLMEnv
from prime_swarm.libs.environments.sandbox import TRUNCATED, Limits

TINY_CONTEXT = 64  # libs/model/build.py's max_position_embeddings
RECIPE_MAX_NEW_TOKENS = 8  # the recipe's default cap per turn
# One CPU second: the killed-session test spins twice.
QUICK = Limits(wall_s=3.0, cpu_s=1)


def play(env: Env, task: Task, turns: Sequence[str]) -> tuple[list[str], float]:
    """Run the scripted `turns` as the worker would, stopping where the environment ends the
    episode; the replies seen and the episode's score."""
    replies: list[str] = []
    for k in range(1, len(turns) + 1):
        if k == env.max_turns:
            break
        reply = env.reply(task, turns[:k])
        if reply is None:
            break
        replies.append(reply)
    return replies, env.score(task, turns[:k])


def py(code: str) -> str:
    return f"```python\n{code}\n```"


@pytest.mark.parametrize("name", ["guess-number", "python-tool", "rlm"])
def test_registered_as_plugins(name: str) -> None:
    env = load_env(name)
    assert env.name == name and env.max_turns > 1
    task = env.sample_tasks(0, 1, "train")[0]
    assert env.task_from_id(task.task_id) == task


# ----------------------------------------------------------------------------- guess-number
def _binary_search(env: GuessNumberEnv, task: Task) -> list[str]:
    """The turns of a binary search that reads the replies, played against the env."""
    lo, hi, turns = env.low, env.high, []
    while True:
        turns.append(str((lo + hi) // 2))
        reply = env.reply(task, turns)
        if reply is None:
            return turns
        lo, hi = (int(turns[-1]) + 1, hi) if reply == env.higher else (lo, int(turns[-1]) - 1)


def _task_with(env: GuessNumberEnv, secret: int) -> Task:
    for index in range(1000):
        task = env.task_from_id(env.task_id("train", index))
        if task.answer == str(secret):
            return task
    raise AssertionError(f"no task with secret {secret}")


def test_guess_number_binary_search_always_wins() -> None:
    env = GuessNumberEnv()
    for secret in range(10):
        task = _task_with(env, secret)
        turns = _binary_search(env, task)
        assert turns[-1] == str(secret) and len(turns) <= env.max_turns
        assert env.score(task, turns) == 1.0 - 0.25 * (len(turns) - 1) > 0


def test_guess_number_replies_and_scores() -> None:
    env = GuessNumberEnv()
    task = _task_with(env, 6)
    assert env.task_from_id(task.task_id).prompt == "guess 0-9:"
    assert env.reply(task, ["3"]) == "+" and env.reply(task, ["3", "8"]) == "-"
    assert env.reply(task, ["3", "6"]) is None  # found
    assert env.reply(task, ["3", "x"]) is None  # not a guess: over
    assert env.reply(task, ["6", "2"]) is None  # an earlier turn already ended it
    assert env.reply(task, ["1", "2", "3", "4"]) is None  # max_turns
    assert env.score(task, ["6"]) == 1.0 and env.reward(task, "6") == 1.0
    assert env.score(task, ["3", "8", "6"]) == 0.5
    assert env.score(task, ["3", "8", "7", "5"]) == 0.0  # never found
    assert env.score(task, ["3", "06"]) == 0.0  # not canonical: not a guess, episode over
    assert env.score(task, ["3", "x", "6"]) == 0.0  # turns after the end do not count
    assert env.score(task, ["1", "2", "3", "4", "6"]) == 0.0


def test_guess_number_is_deterministic() -> None:
    a, b = GuessNumberEnv(), GuessNumberEnv()
    for task in a.sample_tasks(5, 20, "train"):
        turns = ["4", "2", "7"]
        assert a.reply(task, turns) == a.reply(task, turns) == b.reply(task, turns)
        assert b.task_from_id(task.task_id) == task


def test_guess_number_splits_are_other_episodes_over_the_same_secrets() -> None:
    env = GuessNumberEnv()
    train = env.sample_tasks(1, 200, "train")
    held = env.sample_tasks(1, 200, "heldout")
    assert not {t.task_id for t in train} & {t.task_id for t in held}
    everything = {str(s) for s in range(10)}
    assert {t.answer for t in train} == {t.answer for t in held} == everything


def test_guess_number_fits_the_tiny_models_context() -> None:
    # One token per byte, BOS before the prompt, EOS after each turn; replies between turns.
    env = GuessNumberEnv()
    for secret in range(10):
        task = _task_with(env, secret)
        worst = ["0" if secret else "9"] * env.max_turns  # four wrong guesses, three replies
        replies, _ = play(env, task, worst)
        prompt = 1 + len(task.prompt.encode())
        assert len(replies) == env.max_turns - 1
        assert prompt + sum(len(t) + 1 for t in worst) + sum(map(len, replies)) <= TINY_CONTEXT
        # Even turns cut at the recipe's cap fit, so the episode never ends for lack of room.
        long_turns = env.max_turns * RECIPE_MAX_NEW_TOKENS
        assert prompt + long_turns + sum(map(len, replies)) <= TINY_CONTEXT
    assert env.max_answer_chars + 1 <= RECIPE_MAX_NEW_TOKENS


def test_guess_number_warm_start_is_the_first_move_of_a_search() -> None:
    env = GuessNumberEnv()
    rng = random.Random(0)
    task = _task_with(env, 8)
    assert env.noisy_answer(task, rng, 0.0) == env.noisy_answer(task, rng, 1.0) == "4"
    demo = env.demonstration(task, rng, 0.0)
    assert demo == _binary_search(env, task) and env.score(task, demo) > 0
    # The habit: every reply read backwards, so the search runs away from the secret.
    backwards = env.demonstration(task, rng, 1.0)
    assert backwards[:2] == ["4", "1"] and env.score(task, backwards) == 0.0
    assert all(env.guess(t) is not None for t in backwards)


def test_guess_number_verbose_for_instruct_models() -> None:
    env = GuessNumberEnv(low=1, high=100, max_turns=7, verbose=True)
    task = env.sample_tasks(0, 1, "train")[0]
    assert "from 1 to 100" in str(task.prompt)
    secret = int(task.answer)
    wrong = 1 if secret != 1 else 2
    assert env.reply(task, [f"My guess is {wrong}."]) in ("Higher.", "Lower.")
    assert env.score(task, [f"I guess {secret}!"]) == 1.0


@pytest.mark.parametrize("args", [{"low": 5, "high": 5}, {"low": -1}, {"max_turns": 0}])
def test_guess_number_bad_arguments_are_refused(args: dict) -> None:
    with pytest.raises(ValueError):
        GuessNumberEnv(**args)


# ----------------------------------------------------------------------------- python-tool
def test_python_tool_episode_with_persistent_state() -> None:
    env = PythonToolEnv()
    task = env.task_from_id(env.task_id("train", 3))
    answer = int(task.answer)
    turns = [
        "Let me compute it.\n" + py(f"a = {answer - 12}"),
        py("b = a + 12\nb"),
        f"The answer is {answer:,}.",  # thousands separators read as one number
    ]
    replies, score = play(env, task, turns)
    assert replies == [NO_OUTPUT, f"Output:\n{answer}\n"] and score == 1.0
    assert env.reply(task, turns) is None  # the final answer ends the episode
    assert env.score(task, [*turns[:2], f"{answer + 1}"]) == 0.0
    assert env.score(task, [py("1"), py("2"), py("3"), py("4")]) == 0.0  # never answered
    assert env.reply(task, [py("1")] * env.max_turns) is None


@pytest.mark.parametrize(
    ("turn", "code"),
    [
        ("Sure.\n```python\nx = 2\n```\nthen\n```py\nx * 3\n```", "x = 2\n\nx * 3\n"),
        ("```Python\nprint(1)\n```", "print(1)\n"),
        ("```python\nprint(1)", "print(1)"),  # cut off at the token cap: still a call
        ("The answer is 7.", None),
        ("```\nprint(1)\n```", None),  # no language: not a tool call
        ("```python print(1)```", None),  # the code starts on its own line
    ],
)
def test_python_tool_call_syntax(turn: str, code: str | None) -> None:
    assert code_of(turn) == code


def test_python_tool_demonstration_is_a_winning_episode() -> None:
    env = PythonToolEnv()
    rng = random.Random(0)
    for task in env.sample_tasks(2, 3, "train"):
        demo = env.demonstration(task, rng, 0.0)
        replies, score = play(env, task, demo)
        assert replies == [f"Output:\n{task.answer}\n"] and score == 1.0
        assert env.noisy_answer(task, rng, 0.0) == demo[0] and code_of(demo[0])
        habit = env.noisy_answer(task, rng, 1.0)  # answers at once, off by one
        assert code_of(habit) is None and env.reward(task, habit) == 0.0


def test_python_tool_replies_are_deterministic() -> None:
    task = PythonToolEnv().sample_tasks(0, 1, "train")[0]
    turns = [
        py("import random\nwords = {'pear', 'fig', 'kiwi', 'lime'}"),
        py("print(words, random.random(), object())\n1 / 0"),
    ]
    a, b = PythonToolEnv(), PythonToolEnv()
    first = a.reply(task, turns)
    assert first == a.reply(task, turns) == b.reply(task, turns)
    assert first is not None and first.endswith("ZeroDivisionError: division by zero\n")


def test_python_tool_output_is_capped() -> None:
    env = PythonToolEnv(tool_output_chars=256)
    task = env.sample_tasks(0, 1, "train")[0]
    reply = env.reply(task, [py("print('z' * 10_000)")])
    assert reply is not None and reply.endswith(TRUNCATED)
    assert len(reply) == len("Output:\n") + 256


def test_python_tool_a_killed_session_ends_at_the_next_call() -> None:
    env = PythonToolEnv(limits=QUICK)
    task = env.sample_tasks(0, 1, "train")[0]
    spin = py("while True:\n    pass")
    assert env.reply(task, [spin]) == "Output:\nTimeoutError: the cell ran past its time limit\n"
    assert env.reply(task, [spin, py("print(1)")]) is None  # the session is gone
    assert env.score(task, [spin, task.answer]) == 1.0  # answering is still allowed


def test_python_tool_splits_are_disjoint() -> None:
    env = PythonToolEnv()
    train = {env.problem("train", i) for i in range(300)}
    held = {env.problem("heldout", i) for i in range(100)}
    assert not train & held
    assert {f for f, _ in train} == {f for f, _ in held}  # every family in both


# ----------------------------------------------------------------------------- rlm
def _rlm_tasks(env: RLMEnv) -> dict[str, Task]:
    """One train task per family."""
    found: dict[str, Task] = {}
    for index in range(200):
        family = env.problem("train", index)[0]
        found.setdefault(family, env.task_from_id(env.task_id("train", index)))
    assert set(found) == set(RLM_FAMILIES)
    return found


def test_rlm_input_is_only_in_the_repl() -> None:
    env = RLMEnv()
    for task in _rlm_tasks(env).values():
        setup = env.setup(task)
        assert len(setup) > 4 * 1000 > len(str(task.prompt))
        assert setup[-200:-10] not in str(task.prompt)
        reply = env.reply(task, [py("print(context)")])  # seeing it all is not possible
        assert reply is not None and reply.endswith(TRUNCATED)
        assert len(reply) == len("Output:\n") + env.tool_output_chars


def test_rlm_computing_wins_and_guessing_loses() -> None:
    env = RLMEnv()
    task = _rlm_tasks(env)["count_above"]
    threshold = str(task.prompt).split("greater than ")[1].split("?")[0]
    turns = [
        py(f"big = [x for x in context if x > {threshold}]"),
        py("len(big)"),
        f"FINAL({task.answer})",
    ]
    replies, score = play(env, task, turns)
    assert replies == [NO_OUTPUT, f"Output:\n{task.answer}\n"] and score == 1.0
    assert env.score(task, [f"FINAL({int(task.answer) + 1})"]) == 0.0  # a guess
    assert env.score(task, [task.answer]) == 1.0  # a turn without code is an answer too
    assert env.score(task, [py("len(context)")] * env.max_turns) == 0.0


def test_rlm_demonstrations_match_what_their_code_prints() -> None:
    # The warm start's answers are computed here, not by running the code: they must agree with
    # the REPL, the buggy variants included.
    env = RLMEnv()
    rng = random.Random(0)
    for task in _rlm_tasks(env).values():
        for error_rate in (0.0, 1.0):
            code, final = env.demonstration(task, rng, error_rate)
            printed = env.reply(task, [code])
            assert printed == f"Output:\n{final[len('FINAL(') : -1]}\n"
        assert env.score(task, env.demonstration(task, rng, 0.0)) == 1.0


def test_rlm_is_deterministic_across_instances() -> None:
    a, b = RLMEnv(), RLMEnv()
    task = a.sample_tasks(4, 1, "train")[0]
    assert b.task_from_id(task.task_id) == task and a.setup(task) == b.setup(task)
    turns = [py("sorted(set(str(x) for x in context))[:5], hash('x') % 1000")]
    assert a.reply(task, turns) == a.reply(task, turns) == b.reply(task, turns)


def test_rlm_splits_never_share_an_input() -> None:
    env = RLMEnv()
    train = {env.problem("train", i) for i in range(300)}
    held = {env.problem("heldout", i) for i in range(100)}
    assert not train & held
    assert not {seed for *_, seed in train} & {seed for *_, seed in held}
