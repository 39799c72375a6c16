"""Offline async GRPO on one process: build -> warm start -> N steps, printing JSON.

Simulates the network's data flow without services: "workers" sample groups with policy
version s-1 or s-2 (two-step async staleness), a "validator" re-runs the prefill with that
version to replay the sampling and recompute behaviour log-probs, and the "trainer" takes a
GRPO step. Run with one torch thread to mimic one process of the 2-core local network:

    .venv/bin/python bench/rl_offline.py --seeds 0 1 2
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

from prime_swarm.libs.model.build import build_tiny_model
from prime_swarm.libs.model.io import load_pretrained
from prime_swarm.libs.model.tokenizer import decode, encode
from prime_swarm.libs.rl.defaults import RL, WARM_START
from prime_swarm.libs.rl.envs import get_env
from prime_swarm.libs.rl.envs.base import hash_int
from prime_swarm.libs.rl.evaluate import heldout_reward
from prime_swarm.libs.rl.grpo import GRPOConfig, Rollout, grpo_step
from prime_swarm.libs.rl.sampling import completion_logprobs, generate_batch, prefill, replay_check
from prime_swarm.libs.rl.sft import warm_start


def run_seed(seed: int, args: argparse.Namespace, work: Path) -> dict:
    env = get_env(args.env)
    # CPU seconds, not wall: what each process of the network will spend, immune to other load.
    t0 = time.process_time()
    base = build_tiny_model(seed, work / f"base-{seed}")
    warm = warm_start(
        base, work / f"warm-{args.env}-{seed}-{args.sft_steps}-{args.correct_fraction}",
        seed=seed, steps=args.sft_steps, correct_fraction=args.correct_fraction, env=args.env,
    )
    warm_s = time.process_time() - t0
    trainer, tok = load_pretrained(warm)
    worker = copy.deepcopy(trainer)
    versions = {0: copy.deepcopy(trainer.state_dict())}
    opt = torch.optim.AdamW(trainer.parameters(), lr=args.lr, weight_decay=0.0)
    cfg = GRPOConfig(clip_eps=args.clip_eps, temperature=args.temperature)
    rng = random.Random(seed)
    eval_start = heldout_reward(trainer, tok, env, args.eval_tasks, seed)
    curve, evals, timings = [], {0: eval_start}, []
    rejected = 0
    for step in range(1, args.steps + 1):
        tasks = env.sample_tasks(hash_int("bench", seed, step, nbytes=6), args.prompts, "train")
        # Each group comes from version s-1 or s-2 (never older), as async_level=2 admits.
        by_version: dict[int, list[int]] = {}
        for g in range(len(tasks)):
            stale = args.staleness if args.staleness > 0 else rng.choice((1, 2))
            by_version.setdefault(max(0, step - stale), []).append(g)
        batch: list[list[Rollout]] = [[] for _ in tasks]
        t_gen = t_val = 0.0
        for v, groups in by_version.items():
            worker.load_state_dict(versions[v])
            seeds = [hash_int("lease", seed, step, g) for g in groups]
            prompts = [encode(tok, tasks[g].prompt, add_bos=True) for g in groups]
            t = time.process_time()
            comps = generate_batch(
                worker, prompts, seeds, group_size=args.group_size,
                max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                eos_id=worker.config.eos_token_id,
            )
            t_gen += time.process_time() - t
            t = time.process_time()
            seqs = [(p, c.token_ids) for p, grp in zip(prompts, comps, strict=True) for c in grp]
            pre = prefill(worker, seqs)
            for k, (g, p, grp) in enumerate(zip(groups, prompts, comps, strict=True)):
                for j, c in enumerate(grp):
                    out = pre[k * args.group_size + j]
                    ok, _ = replay_check(out.logits, c.token_ids, args.temperature, seeds[k], j,
                                         RL.replay_tol)
                    rejected += not ok
                    reward = env.reward(tasks[g], decode(tok, c.token_ids))
                    batch[g].append(Rollout(p, c.token_ids,
                                            completion_logprobs(out, c.token_ids, args.temperature),
                                            reward))
            t_val += time.process_time() - t
        t = time.process_time()
        stats = grpo_step(trainer, opt, batch, cfg)
        t_train = time.process_time() - t
        versions[step] = copy.deepcopy(trainer.state_dict())
        versions.pop(step - 3, None)
        curve.append(round(stats["reward_mean"], 4))
        timings.append((t_gen, t_val, t_train))
        if args.eval_every and step % args.eval_every == 0 and step != args.steps:
            evals[step] = heldout_reward(trainer, tok, env, args.eval_tasks, seed)
        if args.verbose:
            print(json.dumps({"seed": seed, "step": step, **{k: round(v, 4)
                              for k, v in stats.items()}}), file=sys.stderr)
    eval_end = heldout_reward(trainer, tok, env, args.eval_tasks, seed)
    evals[args.steps] = eval_end
    n = len(timings)
    return {
        "seed": seed,
        "heldout_start": round(eval_start, 4),
        "heldout_end": round(eval_end, 4),
        "heldout_gain": round(eval_end - eval_start, 4),
        "heldout_curve": {k: round(v, 4) for k, v in evals.items()},
        "train_reward_per_step": curve,
        "replay_rejected": rejected,
        "warm_start_cpu_s": round(warm_s, 2),
        "gen_cpu_s_per_step": round(sum(t[0] for t in timings) / n, 3),
        "validate_cpu_s_per_step": round(sum(t[1] for t in timings) / n, 3),
        "train_cpu_s_per_step": round(sum(t[2] for t in timings) / n, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--env", default=RL.env)
    ap.add_argument("--steps", type=int, default=RL.steps)
    ap.add_argument("--prompts", type=int, default=RL.prompts_per_step)
    ap.add_argument("--group-size", type=int, default=RL.group_size)
    ap.add_argument("--temperature", type=float, default=RL.temperature)
    ap.add_argument("--max-new-tokens", type=int, default=RL.max_new_tokens)
    ap.add_argument("--lr", type=float, default=RL.lr)
    ap.add_argument("--clip-eps", type=float, default=RL.clip_eps)
    ap.add_argument("--sft-steps", type=int, default=WARM_START.steps)
    ap.add_argument("--correct-fraction", type=float, default=WARM_START.correct_fraction)
    ap.add_argument("--staleness", type=int, default=0,
                    help="0: each group from version s-1 or s-2 at random; k: always s-k")
    ap.add_argument("--eval-tasks", type=int, default=RL.eval_tasks)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work-dir", type=Path, default=None,
                    help="keeps built models (and the warm-start cache) between runs")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work_dir or Path(tmp)
        results = [run_seed(s, args, work) for s in args.seeds]
    gains = [r["heldout_gain"] for r in results]
    summary = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "runs": results,
        "min_gain": min(gains),
        "mean_gain": round(sum(gains) / len(gains), 4),
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
