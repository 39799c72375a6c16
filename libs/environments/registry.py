"""Environments are plugins: found by name in the `prime_swarm.environments` entry-point group.

An environment is any installed distribution that declares, in its own pyproject.toml,

    [project.entry-points."prime_swarm.environments"]
    my-env = "my_package.module:MyEnv"

where `MyEnv(**args)` returns an `Env` whose `name` is `my-env`. The built-in environments
register the same way (this project's pyproject.toml), so nothing here knows them by name.
Entry points, not a registry written in code, because a pool operator installs an environment
like any package (pip, a wheel in an image) and never edits this project.

The pool's recipe names the environment and its arguments once; every lease repeats both, so a
worker and a validator build the very same instance (`load_env(lease.env, lease.env_args)`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from prime_swarm.libs.environments.base import Env

GROUP = "prime_swarm.environments"


class EnvLoadError(ValueError):
    """An environment that is not installed, does not import, or refuses its arguments."""


_LOCK = threading.Lock()
_INSTANCES: dict[tuple[str, str], Env] = {}


def installed() -> dict[str, EntryPoint]:
    """Every installed environment, by name (read afresh: a test may install one mid-run)."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def env_factory(name: str) -> Any:
    """The callable that builds environment `name`; one-line errors for unknown or broken ones."""
    found = installed()
    if name not in found:
        raise EnvLoadError(
            f"unknown environment {name!r}; installed: {', '.join(sorted(found)) or 'none'}"
        )
    try:
        return found[name].load()
    except Exception as exc:  # a plugin's import error is its own; report it, do not crash
        raise EnvLoadError(
            f"environment {name!r} ({found[name].value}) does not import: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def args_key(args: Mapping[str, Any] | None) -> str:
    """The canonical text of an environment's arguments (the cache key, and what leases carry)."""
    return json.dumps(dict(args or {}), sort_keys=True, separators=(",", ":"), allow_nan=False)


def load_env(name: str, args: Mapping[str, Any] | None = None) -> Env:
    """Environment `name` built with `args`, one instance per (name, args) in this process."""
    key = (name, args_key(args))
    with _LOCK:
        env = _INSTANCES.get(key)
        if env is not None:
            return env
        factory = env_factory(name)
        try:
            env = factory(**dict(args or {}))
        except Exception as exc:
            raise EnvLoadError(
                f"environment {name!r} refused its arguments {key[1]}: {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(env, Env):
            raise EnvLoadError(f"environment {name!r} built a {type(env).__name__}, not an Env")
        if env.name != name:
            # Task ids start with the environment's name; a mismatch would make every task id
            # unparseable on the validator.
            raise EnvLoadError(f"environment {name!r} calls itself {env.name!r}")
        _INSTANCES[key] = env
        return env
