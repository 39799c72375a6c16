"""Plugin environments that break the determinism contract the way plugins do by mistake (not to
cheat), each a multi-turn game as small as `echo_env.EchoCount` so that the untrained tiny model
plays it within its context; and `install`, which makes them (and EchoCount, the deterministic
one) installed plugins: entry points that this process and a fresh interpreter both find, as a
pip-installed package's are."""

from __future__ import annotations

import random
import socket
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

import pytest
from echo_env import EchoCount

from prime_swarm.libs.environments import registry
from prime_swarm.libs.environments.base import Task

PLUGINS = {
    "echo-count": "echo_env:EchoCount",
    "clock-env": "unsteady_envs:ClockEnv",
    "hash-env": "unsteady_envs:HashEnv",
    "counting-env": "unsteady_envs:CountingEnv",
    "host-env": "unsteady_envs:HostEnv",
    "rare-env": "unsteady_envs:RareEnv",
}


class ClockEnv(EchoCount):
    """Its replies carry the wall clock (the microseconds: short enough for the tiny model)."""

    name = "clock-env"

    def reply(self, task: Task, turns: Sequence[str]) -> str | None:
        return f"<{time.time_ns() // 1000 % 1000}>"


class HashEnv(EchoCount):
    """Its replies carry `hash()` of the last turn: the same within a process, another in a
    process with another PYTHONHASHSEED."""

    name = "hash-env"

    def reply(self, task: Task, turns: Sequence[str]) -> str | None:
        return f"<{hash(turns[-1]) % 1000}>"


class CountingEnv(EchoCount):
    """Its replies count its calls: state kept from one call to the next."""

    name = "counting-env"

    def __init__(self) -> None:
        self.calls = 0

    def reply(self, task: Task, turns: Sequence[str]) -> str | None:
        self.calls += 1
        return f"<{self.calls}>"


class HostEnv(EchoCount):
    """Its replies carry a digest of the host's name: the same in every process of one machine,
    another on every other machine (what a plugin that logs where it runs gets wrong)."""

    name = "host-env"

    def reply(self, task: Task, turns: Sequence[str]) -> str | None:
        return f"<{zlib.crc32(socket.gethostname().encode()) % 1000}>"


RARE_RATE = 0.02
_chance = random.SystemRandom()


class RareEnv(EchoCount):
    """Deterministic but for one call in fifty, which answers otherwise (an unseeded branch
    taken rarely): it agrees with itself on most replays, so a validator's few replays rarely
    catch it."""

    name = "rare-env"

    def reply(self, task: Task, turns: Sequence[str]) -> str | None:
        return "<9>" if _chance.random() < RARE_RATE else super().reply(task, turns)


def install(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`PLUGINS` installed for the test: a distribution's metadata in `site`, prepended to
    sys.path (a fresh interpreter started with this sys.path finds them too), and the
    process's environment instances forgotten afterwards."""
    info = site / "unsteady_envs-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: unsteady-envs\nVersion: 0.1\n")
    lines = "".join(f"{name} = {target}\n" for name, target in PLUGINS.items())
    (info / "entry_points.txt").write_text(f"[prime_swarm.environments]\n{lines}")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "_INSTANCES", {})
