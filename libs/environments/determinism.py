"""Is an environment deterministic? Played twice, in two processes, and compared.

The contract (`base.py`) says an environment is a pure function of the task and the model's
turns, because a validator replays every episode and refuses tokens the environment does not
produce again. Nothing else checks it, and an environment that breaks it (replies that carry
the wall clock, a pid, `hash()` of a string, unseeded randomness, a counter kept between calls)
turns honest multi-turn work into `context_mismatch`. Two uses:

- `check_environments`, where a pool starts: a handful of tasks of each environment (both splits,
  a few seeds), each played with turns taken from its own demonstrations and a few fixed and
  altered strings so that `reply` and `score` run over several turns, here and in a fresh
  interpreter at once, and every task, reply and score compared. The fresh interpreter has
  another hash seed and pid, and plays the tasks in the opposite order (state kept between
  calls then shows); it runs as on another host (`elsewhere`): another host name (a UTS
  namespace of its own where the kernel allows), time zone, locale, home, working directory and
  CPU affinity, so that a plugin whose replies depend on the machine disagrees here already,
  not only between a worker's machine and a validator's. One line naming the first
  disagreement, or None.
- `second_look`, where a validator is about to blame a worker for its environment's tokens: the
  claimed turns replayed twice here and once in a fresh interpreter; how the environment
  disagreed with itself, or None when it did not (then the worker is to blame).

Torch-free, like every environment: the orchestrator runs it at start.
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from prime_swarm.libs.environments.base import SPLITS, Env, Task
from prime_swarm.libs.environments.registry import load_env

SEEDS = (0, 1)
"""Seeds of `sample_tasks` played at start, one task of each split per seed: 4 tasks."""
MAX_TURNS = 4
"""The most turns one episode of the start check plays (an environment's own cap may be less)."""
FIXED_TURNS = ("1", "", "no", "```python\nprint(1)\n```")
"""Turns no demonstration writes: a number, nothing, a word, a tool call."""
TIMEOUT_S = 120.0
"""A second process that plays no longer than this (reasoning-gym builds its dataset first)."""
SHOWN_CHARS = 80
_MARK = "\x00prime-swarm-transcript\x00"
"""Opens the transcript on the second process's stdout, whatever the environment printed."""


class CheckFailed(RuntimeError):
    """The second process could not play the environment (crashed, timed out)."""


@dataclass(frozen=True)
class Episode:
    task_id: str
    play: str
    """What the turns are, for the report ("the demonstration", "completion 3")."""
    turns: tuple[str, ...]


@dataclass(frozen=True)
class Job:
    """What a process plays of one environment: tasks sampled by `seeds`, and `episodes`."""

    env: str
    args: Mapping[str, Any] = field(default_factory=dict)
    seeds: tuple[int, ...] = ()
    episodes: tuple[Episode, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Job:
        return cls(
            data["env"],
            data["args"],
            tuple(data["seeds"]),
            tuple(Episode(e["task_id"], e["play"], tuple(e["turns"])) for e in data["episodes"]),
        )


Transcript = dict[str, str]
"""Where (a readable place: "task x/train/3 turn 2 of the demonstration replied") -> what came
out there, as repr() text (a raised exception is its type's name)."""


def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        value = call()
    except Exception as exc:  # noqa: BLE001 - a raise is an outcome to compare like any other
        # The type only: a message may carry an address (`<object at 0x7f...>`).
        return f"raised {type(exc).__name__}", None
    if isinstance(value, float | int) and not isinstance(value, bool):
        return repr(float(value)), value
    return repr(value), value


def play(env: Env, task: Task, episode: Episode, out: Transcript) -> None:
    """The environment's replies after each of the episode's turns, until it ends the episode
    (as `libs/rollout/episode.next_context` asks them: never at its turn limit), and its score
    of the turns played."""
    turns = list(episode.turns)
    played = len(turns)
    for k in range(len(turns)):
        if k + 1 >= env.max_turns:
            played = k + 1
            break
        shown, reply = _outcome(lambda k=k: env.reply(task, turns[: k + 1]))
        out[f"task {task.task_id} turn {k} of {episode.play} replied"] = shown
        if not isinstance(reply, str):  # None ends the episode, and so does a raise
            played = k + 1
            break
    out[f"task {task.task_id} scored {episode.play}"] = _outcome(
        lambda: env.score(task, turns[:played])
    )[0]


def transcript(job: Job, backwards: bool = False) -> Transcript:
    """Everything `job` makes the environment say, in this process; `backwards` plays it in
    the opposite order, so that state kept from one call to the next shows."""
    env = load_env(job.env, job.args)
    steps: list[Callable[[Transcript], None]] = []
    for seed in job.seeds:
        for split in SPLITS:
            steps.append(lambda out, seed=seed, split=split: _sampled(env, seed, split, out))
    tasks: dict[str, Task | None] = {}

    def episode_step(e: Episode) -> Callable[[Transcript], None]:
        def run(out: Transcript) -> None:
            if e.task_id not in tasks:
                shown, task = _outcome(lambda: env.task_from_id(e.task_id))
                out[f"task {e.task_id} was derived as"] = (
                    task.model_dump_json() if isinstance(task, Task) else shown
                )
                tasks[e.task_id] = task if isinstance(task, Task) else None
            task = tasks[e.task_id]
            if task is not None:
                play(env, task, e, out)

        return run

    steps += [episode_step(e) for e in job.episodes]
    out: Transcript = {}
    for step in reversed(steps) if backwards else steps:
        step(out)
    return out


def _sampled(env: Env, seed: int, split: str, out: Transcript) -> None:
    shown, tasks = _outcome(lambda: env.sample_tasks(seed, 1, split))  # type: ignore[arg-type]
    out[f"seed {seed} sampled {split} tasks"] = (
        repr([t.task_id for t in tasks]) if isinstance(tasks, list) else shown
    )


# --------------------------------------------------------------------------- two processes
_MODULE = "prime_swarm.libs.environments.determinism"


ELSEWHERE_HOST = "prime-swarm-elsewhere"
"""The made-up host name the fresh process runs under (where it gets a UTS namespace)."""
ELSEWHERE = {"TZ": "Pacific/Chatham", "LANG": "C", "LC_ALL": "C", "HOME": "/nonexistent"}
"""What else differs there: a time zone 12:45 off UTC (and 13:45 in summer), another locale
and home."""


@functools.cache
def own_uts_namespace() -> bool:
    """Whether this machine lets a child take a host name of its own (a new UTS namespace: root,
    or a user namespace; some container runtimes refuse both). Asked once per process."""
    if shutil.which("unshare") is None:
        return False
    for flags in (["--uts"], ["--user", "--map-root-user", "--uts"]):
        try:
            ok = subprocess.run(
                ["unshare", *flags, "--fork", "hostname", ELSEWHERE_HOST],
                capture_output=True,
                timeout=10,
            )
        except (OSError, subprocess.SubprocessError):
            return False
        if ok.returncode == 0:
            return True
    return False


def elsewhere(argv: list[str]) -> list[str]:
    """`argv` as run on another host: its own host name where the kernel allows, one CPU."""
    if shutil.which("taskset") is not None:
        argv = ["taskset", "-c", str(min(os.sched_getaffinity(0))), *argv]
    if not own_uts_namespace():
        return argv
    flags = ["--uts"] if os.geteuid() == 0 else ["--user", "--map-root-user", "--uts"]
    script = 'hostname "$0" && exec "$@"'
    return ["unshare", *flags, "--fork", "--kill-child", "sh", "-c", script, ELSEWHERE_HOST, *argv]


class FreshProcess:
    """A fresh interpreter playing `jobs` backwards, started at once (`transcripts` waits for
    it): the same installation (this process's sys.path, so a plugin found here is found
    there), another hash seed and another pid, on a made-up other host (`elsewhere`)."""

    def __init__(self, jobs: Sequence[Job], timeout_s: float = TIMEOUT_S) -> None:
        env = {**os.environ, **ELSEWHERE}
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        seed = env.get("PYTHONHASHSEED", "")
        if seed.isdigit():
            env["PYTHONHASHSEED"] = str((int(seed) + 1) % 2**32)
        else:  # unset or "random": a random seed there too, another than this one's
            env.pop("PYTHONHASHSEED", None)
        self.timeout_s = timeout_s
        self._cwd = tempfile.TemporaryDirectory(prefix="prime-elsewhere-")
        self.proc = subprocess.Popen(
            elsewhere([sys.executable, "-m", _MODULE]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=self._cwd.name,
            text=True,
        )
        assert self.proc.stdin is not None
        try:  # now, so that it plays while this process does: one line, read before it writes
            self.proc.stdin.write(json.dumps([asdict(j) for j in jobs]) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:  # it died at start: `transcripts` says why
            pass

    def transcripts(self) -> list[Transcript]:
        """Its transcripts, one per job, once it ends; CheckFailed if it did not play them."""
        try:
            stdout, stderr = self.proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            raise CheckFailed(f"it played for more than {self.timeout_s:.0f} s") from None
        finally:
            self._cwd.cleanup()
        if self.proc.returncode != 0 or _MARK not in stdout:
            lines = [line for line in stderr.strip().splitlines() if line.strip()]
            raise CheckFailed(lines[-1] if lines else f"exit status {self.proc.returncode}")
        return json.loads(stdout.rsplit(_MARK, 1)[1])

    def stop(self) -> None:
        self.proc.kill()
        self.proc.communicate()
        self._cwd.cleanup()


def first_disagreement(here: Transcript, there: Transcript) -> tuple[str, str, str] | None:
    """(where, here, there) at the first place two transcripts differ, in `here`'s order."""
    for where in [*here, *(w for w in there if w not in here)]:
        a, b = here.get(where, "nothing"), there.get(where, "nothing")
        if a != b:
            return where, a, b
    return None


def _shown(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _said(env: str, where: str, a: str, b: str, one: str, other: str) -> str:
    return (
        f"environment {env!r} is not deterministic: {where} {_shown(a)} in {one} and "
        f"{_shown(b)} in {other}"
    )


# --------------------------------------------------------------------------- the pool's start
def start_job(name: str, args: Mapping[str, Any] | None = None) -> Job:
    """The episodes played at start: for each sampled task, its demonstration, a noisy one, its
    answer, its demonstration altered, and fixed turns, each padded to `MAX_TURNS` with its last
    turn (an episode ends where the environment ends it)."""
    env = load_env(name, args)
    n = min(env.max_turns, MAX_TURNS)
    episodes = []
    for seed in SEEDS:
        for split in SPLITS:
            for task in env.sample_tasks(seed, 1, split):
                clean = env.demonstration(task, random.Random(seed), 0.0)
                plays = {
                    "the demonstration": clean,
                    "a noisy demonstration": env.demonstration(task, random.Random(seed), 1.0),
                    "the answer": [task.answer],
                    "the demonstration altered": [f"{t}\n0" for t in clean],
                    "fixed turns": list(FIXED_TURNS),
                }
                for what, turns in plays.items():
                    padded = (list(turns) or [""])[:n]
                    padded += [padded[-1]] * (n - len(padded))
                    episodes.append(Episode(task.task_id, what, tuple(padded)))
    return Job(name, dict(args or {}), SEEDS, tuple(episodes))


def check_environments(
    envs: Iterable[tuple[str, Mapping[str, Any] | None]], timeout_s: float = TIMEOUT_S
) -> str | None:
    """One line naming the first environment that is not deterministic (or cannot be played in
    a fresh process), or None when each agrees with itself. `envs`: (name, arguments) pairs,
    e.g. a recipe's shares. One fresh process plays them all, while this one does."""
    jobs = []
    for name, args in envs:
        try:
            jobs.append(start_job(name, args))
        except Exception as exc:  # noqa: BLE001 - a plugin's bug is one line, not a traceback
            first = (str(exc).splitlines() or [""])[0]
            return f"environment {name!r} could not be played: {type(exc).__name__}: {first}"
    fresh = FreshProcess(jobs, timeout_s)
    try:
        here = [transcript(job) for job in jobs]
    except BaseException:
        fresh.stop()
        raise
    try:
        there = fresh.transcripts()
    except CheckFailed as exc:
        names = ", ".join(repr(j.env) for j in jobs)
        return f"environment {names} could not be played in a second process: {exc}"
    for job, a, b in zip(jobs, here, there, strict=True):
        found = first_disagreement(a, b)
        if found is not None:
            return _said(job.env, *found, "one process", "another")
    return None


# --------------------------------------------------------------------------- the validator's doubt
def second_look(
    name: str,
    args: Mapping[str, Any] | None,
    episodes: Sequence[Episode],
    timeout_s: float = TIMEOUT_S,
) -> str | None:
    """Does the environment disagree with itself on these claimed episodes? Played twice here
    and once in a fresh process; how it disagreed (one line), or None when all three agree. A
    fresh process that cannot play them says so: the environment cannot be trusted to judge."""
    job = Job(name, dict(args or {}), (), tuple(episodes))
    fresh = FreshProcess([job], timeout_s)
    try:
        first, again = transcript(job), transcript(job)
    except BaseException:
        fresh.stop()
        raise
    found = first_disagreement(first, again)
    if found is not None:
        fresh.stop()
        return _said(name, *found, "one call", "the next, in one process")
    try:
        (elsewhere,) = fresh.transcripts()
    except CheckFailed as exc:
        return f"environment {name!r} could not replay the episodes in a fresh process: {exc}"
    found = first_disagreement(first, elsewhere)
    if found is not None:
        return _said(name, *found, "this process", "a fresh one")
    return None


def _main() -> None:
    """The fresh process: jobs (a JSON line) on stdin, their transcripts after `_MARK` on
    stdout. Whatever an environment prints goes to stderr meanwhile."""
    jobs = [Job.from_json(j) for j in json.loads(sys.stdin.readline())]
    out, sys.stdout = sys.stdout, sys.stderr
    transcripts = [transcript(job, backwards=True) for job in jobs]
    out.write(_MARK + json.dumps(transcripts))
    out.flush()


if __name__ == "__main__":
    _main()
