"""Offline async GRPO in one process: build -> warm start -> N steps, printing JSON.

Simulates the network's data flow without services: "workers" sample each group with policy
version s-1 or s-2 (the two-step staleness async_level=2 admits), a "validator" re-runs the
prefill with that version to replay the Gumbel sampling, check termination and recompute the
behaviour log-probs, and the "trainer" takes one GRPO step. Run with one torch thread to mimic
one process of the 2-core local network:

    .venv/bin/python -m bench.rl --seeds 0 1 2

Timings are CPU seconds of this process (the machine may be shared; CPU time is what each
service will spend), plus wall seconds per step for reference.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from prime_swarm.libs.environments import Env, Task, load_env
from prime_swarm.libs.environments.base import hash_int
from prime_swarm.libs.model.build import build_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.hf_backend import HFBackend
from prime_swarm.libs.model.io import load_pretrained
from prime_swarm.libs.model.logprobs import token_logprobs
from prime_swarm.libs.model.tokenizer import decode, prompt_ids
from prime_swarm.libs.rl.defaults import RL, WARM_START
from prime_swarm.libs.rl.grpo import GRPOConfig, Rollout, make_optimizer
from prime_swarm.libs.rl.loss import LossConfig
from prime_swarm.libs.rl.step import train_step
from prime_swarm.libs.rollout.calibration import acceptance_for
from prime_swarm.libs.rollout.episode import termination_ok
from prime_swarm.libs.rollout.evaluate import heldout_reward
from prime_swarm.libs.rollout.recipe import Recipe
from prime_swarm.libs.rollout.recompute import prefill_hidden
from prime_swarm.libs.rollout.verify import replay_gaps
from prime_swarm.libs.warmstart import warm_start

RECIPE = Recipe()
BACKEND = HFBackend("bf16")


class Clock:
    """Accumulates CPU seconds per phase."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self._start = 0.0

    def start(self) -> None:
        self._start = time.process_time()

    def stop(self, phase: str) -> None:
        self.totals[phase] = self.totals.get(phase, 0.0) + time.process_time() - self._start


def worker_and_validator(
    worker: CausalLM,
    env: Env,
    tasks: list[Task],
    seeds: list[int],
    args: argparse.Namespace,
    clock: Clock,
) -> tuple[list[list[Rollout]], int]:
    """Sample the groups (worker), then verify them and attach behaviour log-probs (validator)."""
    tok = worker.tokenizer
    prompts = [prompt_ids(tok, t.prompt) for t in tasks]
    clock.start()
    groups = BACKEND.generate(
        worker,
        prompts,
        seeds,
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
    )
    clock.stop("gen")
    clock.start()
    flat = [(p, c) for p, grp in zip(prompts, groups, strict=True) for c in grp]
    accept = acceptance_for("hf")
    assert accept is not None
    ref = worker.cast(BACKEND.precision)
    hiddens = prefill_hidden(ref, [(p, c.token_ids) for p, c in flat], BACKEND.precision)
    tol = accept.recheck.max_replay_gap
    rollouts: list[list[Rollout]] = [[] for _ in tasks]
    rejected = 0
    for i, ((p, c), hidden) in enumerate(zip(flat, hiddens, strict=True)):
        g, j = divmod(i, args.group_size)
        logits = ref.head_logits(hidden)
        ok = float(replay_gaps(logits, c.token_ids, args.temperature, seeds[g], j).max()) <= tol
        ok &= termination_ok(c.token_ids, c.finish_reason, worker.eos_ids, args.max_new_tokens)
        if not ok:
            rejected += 1
            continue
        reward = env.reward(tasks[g], decode(tok, c.token_ids))
        tokens = torch.tensor(c.token_ids)
        logprobs = token_logprobs(logits, tokens, args.temperature).tolist()
        rollouts[g].append(Rollout(p, c.token_ids, logprobs, reward, args.temperature))
    clock.stop("validate")
    return rollouts, rejected


def load_version(model_dir: Path, state: dict) -> CausalLM:
    lm = load_pretrained(model_dir)
    lm.module.load_state_dict(state)
    return lm


def run_seed(seed: int, args: argparse.Namespace, work: Path) -> dict:
    env = load_env(args.env)
    t0 = time.process_time()
    base = build_tiny_model(seed, work / f"base-{seed}")
    warm = warm_start(
        base,
        work / f"warm-{args.env}-{seed}-{args.sft_steps}-{args.error_rate}-{args.warm_lr}",
        seed=seed,
        steps=args.sft_steps,
        error_rate=args.error_rate,
        env=args.env,
        lr=args.warm_lr,
    )
    warm_s = time.process_time() - t0
    trainer = load_pretrained(warm)
    versions = {0: copy.deepcopy(trainer.module.state_dict())}
    opt = make_optimizer(trainer, lr=args.lr)
    cfg = GRPOConfig(loss=LossConfig(eps_low=args.clip_eps, eps_high=args.clip_eps))
    rng = random.Random(seed)
    clock = Clock()
    evals = {0: heldout_reward(trainer, env, args.eval_tasks, seed)}
    curve, rejected, wall = [], 0, 0.0
    for step in range(1, args.steps + 1):
        w0 = time.perf_counter()
        tasks = env.sample_tasks(hash_int("bench", seed, step, nbytes=6), args.prompts, "train")
        by_version: dict[int, list[int]] = {}
        for g in range(len(tasks)):
            stale = args.staleness or rng.choice((1, 2))
            by_version.setdefault(max(0, step - stale), []).append(g)
        batch: list[list[Rollout]] = []
        for v, idx in by_version.items():
            # A fresh copy per version: the backend's bf16 cast is a snapshot of its weights.
            worker = load_version(warm, versions[v])
            seeds = [hash_int("lease", seed, step, g) for g in idx]
            groups, bad = worker_and_validator(
                worker, env, [tasks[g] for g in idx], seeds, args, clock
            )
            batch += groups
            rejected += bad
        clock.start()
        stats = train_step(trainer, opt, batch, cfg)
        clock.stop("train")
        wall += time.perf_counter() - w0
        versions[step] = copy.deepcopy(trainer.module.state_dict())
        versions.pop(step - 3, None)  # async_level=2: nothing older is ever sampled from
        curve.append(round(stats["reward_mean"], 4))
        if step == args.steps or (args.eval_every and step % args.eval_every == 0):
            evals[step] = heldout_reward(trainer, env, args.eval_tasks, seed)
        if args.verbose:
            print(
                json.dumps(
                    {"seed": seed, "step": step, **{k: round(v, 4) for k, v in stats.items()}}
                ),
                file=sys.stderr,
            )
    per_step = {k: round(v / args.steps, 3) for k, v in clock.totals.items()}
    return {
        "seed": seed,
        "heldout_start": round(evals[0], 4),
        "heldout_end": round(evals[args.steps], 4),
        "heldout_gain": round(evals[args.steps] - evals[0], 4),
        "heldout_curve": {k: round(v, 4) for k, v in evals.items()},
        "train_reward_per_step": curve,
        "replay_rejected": rejected,
        "warm_start_cpu_s": round(warm_s, 2),
        "cpu_s_per_step": {**per_step, "total": round(sum(per_step.values()), 3)},
        "wall_s_per_step": round(wall / args.steps, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--env", default=RECIPE.env)
    ap.add_argument("--steps", type=int, default=RL.steps)
    ap.add_argument("--prompts", type=int, default=RL.prompts_per_step)
    ap.add_argument("--group-size", type=int, default=RECIPE.group_size)
    ap.add_argument("--temperature", type=float, default=RECIPE.temperature)
    ap.add_argument("--max-new-tokens", type=int, default=RECIPE.max_new_tokens)
    ap.add_argument("--lr", type=float, default=RL.lr)
    ap.add_argument("--clip-eps", type=float, default=LossConfig().eps_high)
    ap.add_argument("--sft-steps", type=int, default=WARM_START.steps)
    ap.add_argument("--error-rate", type=float, default=WARM_START.error_rate)
    ap.add_argument(
        "--staleness",
        type=int,
        default=0,
        choices=(0, 1, 2),
        help="0: each group from version s-1 or s-2 at random; k: always s-k",
    )
    ap.add_argument("--eval-tasks", type=int, default=RL.eval_tasks)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="keep built models (and the warm-start cache) between runs",
    )
    ap.add_argument("--verbose", action="store_true", help="per-step GRPO stats on stderr")
    ap.add_argument("--warm-lr", type=float, default=WARM_START.lr)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        results = [run_seed(s, args, args.work_dir or Path(tmp)) for s in args.seeds]
    gains = [r["heldout_gain"] for r in results]
    print(
        json.dumps(
            {
                "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                "runs": results,
                "min_gain": min(gains),
                "mean_gain": round(sum(gains) / len(gains), 4),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
