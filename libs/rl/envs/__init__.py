"""Registry of verifiable RL environments, looked up by name (the name is part of each task id)."""

from __future__ import annotations

from collections.abc import Callable

from prime_swarm.libs.rl.envs.arith import ArithEnv
from prime_swarm.libs.rl.envs.base import SPLITS, Env, Split, Task
from prime_swarm.libs.rl.envs.code import CodeEnv
from prime_swarm.libs.rl.envs.reverse import ReverseEnv

_FACTORIES: dict[str, Callable[[], Env]] = {
    "reverse": ReverseEnv,
    "arith": ArithEnv,
    "code": CodeEnv,
}
_INSTANCES: dict[str, Env] = {}


def register_env(name: str, factory: Callable[[], Env]) -> None:
    _FACTORIES[name] = factory
    _INSTANCES.pop(name, None)


def get_env(name: str) -> Env:
    if name not in _FACTORIES:
        raise KeyError(f"unknown env {name!r}; known: {sorted(_FACTORIES)}")
    if name not in _INSTANCES:
        _INSTANCES[name] = _FACTORIES[name]()
    return _INSTANCES[name]


def env_for_task(task_id: str) -> Env:
    """The env a task id belongs to (ids start with the env name)."""
    return get_env(task_id.split("/", 1)[0])


__all__ = ["SPLITS", "Env", "Split", "Task", "env_for_task", "get_env", "register_env"]
