"""INTELLECT-2's offline filter: keep the tasks a policy neither always solves nor never solves.

A task whose every completion gets the same reward gives GRPO a zero advantage for the whole
group, so it spends generation and verification for no gradient. Scoring each task's pass rate
once, before training, and leasing only those inside a band (default [0.1, 0.8]) keeps the pool's
work where the policy can still learn. `prime-swarm filter-tasks` writes the task list; the
orchestrator's `task_file` setting leases from it.

This module is the band and the file, torch-free, because the orchestrator reads the list; the
pass rates come from playing the tasks under a policy (`libs/rollout/evaluate.pass_rates`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from prime_swarm.libs.environments.base import Env

DEFAULT_BAND: tuple[float, float] = (0.1, 0.8)
# The orchestrator reads the list at start-up; a bigger file is a mistake, not a task list
# (a million task ids is about 60 MiB).
MAX_TASK_FILE_BYTES = 64 * 1024 * 1024


def keep_band(rates: dict[str, float], lo: float, hi: float) -> list[str]:
    """Task ids with lo <= pass rate <= hi, sorted so the same rates give the same file."""
    return sorted(t for t, r in rates.items() if lo <= r <= hi)


class TaskRate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_id: str = Field(min_length=1)
    pass_rate: float = Field(ge=0.0, le=1.0)


class TaskList(BaseModel):
    """The file `prime-swarm filter-tasks` writes and the orchestrator's `task_file` reads."""

    model_config = ConfigDict(extra="forbid")

    env: str
    band: tuple[float, float]
    samples: int = Field(ge=1)
    policy: str
    tasks: list[TaskRate]


def save_task_list(
    path: str | Path,
    *,
    env: str,
    band: tuple[float, float],
    samples: int,
    policy: str | Path,
    rates: dict[str, float],
    keep: Sequence[str],
) -> Path:
    """Write the kept tasks with their pass rates; atomic, so a reader never sees half a file."""
    doc = TaskList(
        env=env,
        band=band,
        samples=samples,
        policy=str(policy),
        tasks=[TaskRate(task_id=t, pass_rate=rates[t]) for t in keep],
    )
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(doc.model_dump_json(indent=1) + "\n")
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


def load_task_list(path: str | Path, envs: Mapping[str, Env]) -> tuple[str, list[str]]:
    """The environment a task list is for (one of the pool's `envs`) and its task ids;
    ValueError says what is wrong with the file."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise ValueError(f"task file {p}: cannot read it ({exc.strerror})") from exc
    # Checked before reading: a wrong path to a huge file must not be pulled into memory.
    if size > MAX_TASK_FILE_BYTES:
        raise ValueError(
            f"task file {p} is {size} bytes, over the {MAX_TASK_FILE_BYTES} byte limit"
        )
    try:
        doc = TaskList.model_validate_json(p.read_bytes())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "document"
        raise ValueError(f"task file {p} is not a task list: {where}: {first['msg']}") from exc
    if doc.env not in envs:
        pool = ", ".join(map(repr, envs))
        raise ValueError(f"task file {p} lists {doc.env!r} tasks, but the pool's env is {pool}")
    env = envs[doc.env]
    if not doc.tasks:
        raise ValueError(f"task file {p} lists no tasks (is the band {list(doc.band)} too tight?)")
    for t in doc.tasks:
        # Caught here rather than at the first lease; heldout tasks would leak the eval set.
        try:
            split, _ = env.parse_task_id(t.task_id)
        except ValueError as exc:
            raise ValueError(f"task file {p}: {exc}") from exc
        if split != "train":
            raise ValueError(f"task file {p}: {t.task_id!r} is not a train task")
    return doc.env, [t.task_id for t in doc.tasks]


def histogram(rates: dict[str, float], bins: int = 5) -> list[int]:
    """Counts of pass rates in `bins` equal bins over [0, 1] (1.0 falls in the last)."""
    counts = [0] * bins
    for r in rates.values():
        counts[min(int(r * bins), bins - 1)] += 1
    return counts


__all__ = [
    "DEFAULT_BAND",
    "MAX_TASK_FILE_BYTES",
    "TaskList",
    "histogram",
    "keep_band",
    "load_task_list",
    "save_task_list",
]
