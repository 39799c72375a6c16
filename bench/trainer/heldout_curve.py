"""Held-out accuracy along a run, and the time a run takes to reach a given accuracy.

A run's checkpoints are scored after it ends (never beside it: the bench's two cores are the
run's), in a spawned process of its own with one vLLM engine whose weights are reloaded per
checkpoint: on SmolLM2 that scores a checkpoint several times faster than the transformers
evaluator `make up` uses, greedy and in fp32 like it (`agreement` in the results compares the
two on one checkpoint). Times are seconds since the end of the run's first step, as the
benches' reward curves; the policy before training stands at 0.
"""

from __future__ import annotations

import multiprocessing
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from prime_swarm.deploy.local.cli import heldout_by_env, weighted
from prime_swarm.deploy.local.settings import LocalNetworkSettings

# Points of the averaged curve: one every GRID_S seconds.
GRID_S = 10.0


def in_child(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` in a spawned process, so that what it held (a TRL run's 9 GB, a
    vLLM engine) goes back to the OS before the next run starts."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args, **kwargs).result()


def score_dirs(dirs: Sequence[Path], s: LocalNetworkSettings) -> list[dict[str, float]]:
    """Greedy held-out accuracy of each directory by environment (run it `in_child`)."""
    from prime_swarm.libs.model.backend import make_backend

    backend = make_backend("vllm", precision="fp32")
    return [{k: round(v, 4) for k, v in heldout_by_env(d, s, backend).items()} for d in dirs]


def curve(
    start: dict[str, float], points: Sequence[tuple[float, Path]], s: LocalNetworkSettings
) -> list[list]:
    """[[seconds, weighted accuracy, by environment], ...]: the start, then each checkpoint."""
    scored = in_child(score_dirs, [d for _, d in points], s)
    rows = [(0.0, start), *((t, by_env) for (t, _), by_env in zip(points, scored, strict=True))]
    return [[t, round(weighted(by_env, s), 4), by_env] for t, by_env in rows]


def _at(c: Sequence[Sequence], t: float) -> float:
    """A run's weighted accuracy at `t`, linear between its points."""
    for (t0, y0, *_), (t1, y1, *_) in zip(c, c[1:], strict=False):
        if t0 <= t <= t1:
            return y0 + (y1 - y0) * (t - t0) / (t1 - t0) if t1 > t0 else y1
    return c[-1][1]


def mean_curve(curves: Sequence[Sequence[Sequence]]) -> list[list[float]]:
    """The runs' mean weighted accuracy every GRID_S seconds, up to the longest run's end (a
    run that ended earlier stays at its end's accuracy: its policy from then on)."""
    end = max(c[-1][0] for c in curves)
    grid = [k * GRID_S for k in range(int(end // GRID_S) + 1)]
    if grid[-1] < end:
        grid.append(end)
    return [[round(t, 1), round(statistics.mean(_at(c, t) for c in curves), 4)] for t in grid]


def time_to(c: Sequence[Sequence[float]], target: float) -> float | None:
    """The first time the curve reaches `target`, linear between points; None if it never
    does."""
    if c[0][1] >= target:
        return c[0][0]
    for (t0, y0, *_), (t1, y1, *_) in zip(c, c[1:], strict=False):
        if y1 >= target:
            return round(t0 + (t1 - t0) * (target - y0) / (y1 - y0), 1)
    return None
