"""`python -m bench.trainer --only selection`: live prompt selection on and off, on the tiny
model and a mixture with a task it can barely do, three seeds a side.

The mixture is the string reversal the tiny model is warm-started to half-do (weight 2) and
arithmetic it can hardly do at all (weight 1), each a finite set of 64 train prompts
(`--train-tasks`: prompts recur, as in a real dataset, so a pass rate can be learnt). Both
sides run the same steps with the online zero-variance filter on; what differs is whether the
orchestrator skips the prompts whose last group all passed or all failed. Per run: the wall
time of the trained window, the rollouts generated and validated (each a lease, a group's
generations and a validation), the zero-advantage groups by environment (the work that taught
nothing), the groups trained by environment and the held-out reward by environment.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from prime_swarm.deploy.local.cli import heldout_by_env, prepare_model
from prime_swarm.deploy.local.settings import LocalNetworkSettings
from prime_swarm.libs.rollout.recipe import EnvShare

MIXTURE = [EnvShare(env="reverse", weight=2.0), EnvShare(env="arith", weight=1.0)]
TRAIN_TASKS = 64
STEPS = 30
SEEDS = [0, 1, 2]


def run_selection(out: dict, saved: Callable[[dict], None], seeds: list[int] = SEEDS) -> dict:
    from .compare import machine, run_network

    base = LocalNetworkSettings(mixture=MIXTURE, steps=STEPS, train_tasks=TRAIN_TASKS)
    init_dir = prepare_model(base, say=lambda _m: None)
    start = {k: round(v, 4) for k, v in heldout_by_env(init_dir, base).items()}
    for seed in seeds:
        for side, on in (("off", False), ("on", True)):
            recipe = base.recipe.model_copy(
                update={"selection": base.recipe.selection.model_copy(update={"enabled": on})}
            )
            settings = base.model_copy(update={"recipe": recipe, "task_seed": seed})
            print(f"selection {side}, seed {seed} ...", file=sys.stderr)
            with tempfile.TemporaryDirectory(prefix="bench-selection-") as tmp:
                run = run_network(settings, init_dir, Path(tmp))
            runs = dict(out.get(side, {}).get("runs", {}))
            runs[str(seed)] = run
            out[side] = _summary(runs)
            out["config"] = {
                "model": "tiny (warm-started on the mixture)",
                "mixture": [x.model_dump() for x in MIXTURE],
                "train_tasks": TRAIN_TASKS,
                "steps": STEPS,
                "groups_per_step": base.groups_per_step,
                "group_size": base.recipe.group_size,
                "selection": base.recipe.selection.model_dump(exclude={"enabled"}),
                "heldout_start_by_env": start,
                "machine": machine(),
            }
            out["ratios"] = _ratios(out)
            saved(out)
    return out


def _mean(xs: list[float]) -> float:
    return round(statistics.mean(xs), 4)


def _summary(runs: dict[str, dict]) -> dict:
    rs = list(runs.values())
    envs = sorted({e for r in rs for e in r["heldout_end_by_env"]})
    return {
        "seeds": sorted(int(k) for k in runs),
        "wall_s": _mean([r["wall_s"] for r in rs]),
        "generated_groups": _mean([r["rollouts"]["submitted"] for r in rs]),
        "validated_groups": _mean(
            [r["rollouts"]["verified"] + r["rollouts"]["rejected"] for r in rs]
        ),
        "heldout_end_by_env": {e: _mean([r["heldout_end_by_env"][e] for r in rs]) for e in envs},
        "heldout_end": _mean([r["reward_end"] for r in rs]),
        "groups_trained_by_env": {
            e: _mean([r["groups_by_env"].get(e, 0) for r in rs]) for e in envs
        },
        "zero_advantage_by_env": {
            e: _mean([r["zero_advantage_by_env"].get(e, 0) for r in rs]) for e in envs
        },
        "skipped_by_env": {
            e: _mean([r["selection"].get(e, {}).get("skipped", 0) for r in rs]) for e in envs
        },
        "runs": runs,
    }


def _ratios(out: dict) -> dict:
    if "on" not in out or "off" not in out:
        return {}
    on, off = out["on"], out["off"]
    return {
        "on_over_off_wall_s": round(on["wall_s"] / off["wall_s"], 3),
        "on_over_off_generated": round(on["generated_groups"] / off["generated_groups"], 3),
        "on_over_off_zero_advantage": round(
            sum(on["zero_advantage_by_env"].values())
            / max(sum(off["zero_advantage_by_env"].values()), 1),
            3,
        ),
        "on_minus_off_heldout_end": round(on["heldout_end"] - off["heldout_end"], 4),
    }
