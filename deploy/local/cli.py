"""`prime-swarm up`: the whole network on this machine, training the tiny model.

Builds (or reuses) the tiny model and its warm start, starts every service as its own process,
prints one line per trainer step, then writes runs/<timestamp>/summary.json and reward.png.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prime_swarm.deploy import compose_secrets
from prime_swarm.libs.localnet.process import ProcessFailed
from prime_swarm.protocol.messages import StepProgress

from .settings import LocalNetworkSettings


def prepare_model(s: LocalNetworkSettings, say: Callable[[str], None] = print) -> Path:
    from prime_swarm.libs.rl.sft import warm_start

    def progress(step: int, total: int, loss: float) -> None:
        say(f"  warm start step {step:>4}/{total}  loss {loss:.3f}")

    out = s.cache_dir / "models" / f"warm-seed{s.model_seed}-steps{s.warm_start_steps}"
    return warm_start(
        s.model_seed, out, seed=s.model_seed, steps=s.warm_start_steps, progress=progress
    )


def heldout(model_dir: Path, s: LocalNetworkSettings) -> float:
    from prime_swarm.libs.model.io import load_pretrained
    from prime_swarm.libs.rl.envs import get_env
    from prime_swarm.libs.rl.evaluate import heldout_reward

    return heldout_reward(
        load_pretrained(model_dir), get_env(s.recipe.env), s.eval_tasks, seed=12345
    )


def run(s: LocalNetworkSettings) -> dict[str, object]:
    import torch

    from . import report
    from .network import LocalNetwork, new_run_dir, point_latest

    torch.set_num_threads(2)
    say = (lambda *_a, **_k: None) if s.quiet else print
    started = time.time()
    run_dir = new_run_dir(s.runs_dir)
    say(f"run folder: {run_dir}")
    say("building the tiny Qwen2 model and its warm start (cached after the first run) ...")
    init_dir = prepare_model(s, say)
    net = LocalNetwork(s, init_dir, run_dir)
    try:
        topo = net.start()
        say(
            f"network up: pool {topo.pool_id} on {topo.rpc_url}, orchestrator "
            f"{topo.orchestrator_url}, relay {topo.relay_url}, {len(topo.workers)} workers "
            f"({', '.join(net.worker_backend(i) for i in range(len(topo.workers)))})"
        )
        say(f"{'step':>4} {'reward':>7} {'accepted':>8} {'rejected':>8} {'lag':>5} {'s/step':>6}")
        last = [time.time()]

        def on_step(row: StepProgress) -> None:
            now = time.time()
            say(
                f"{row.step:>4} {row.mean_reward:>7.3f} {row.accepted_total:>8} "
                f"{row.rejected_total:>8} {row.policy_lag_mean:>5.2f} {now - last[0]:>6.1f}"
            )
            last[0] = now

        rows = net.follow(on_step, s.timeout_s)
        net.stop_workers()
        net.procs["validator"].stop(timeout_s=60)  # flushes queued attestations first
        counts = net.stream_counts()
        attested = net.attested_units()
    finally:
        net.stop()
    say("evaluating held-out reward of the start and final policies ...")
    final_dir = run_dir / "checkpoints" / f"v{s.steps}"
    start_r, end_r = heldout(init_dir, s), heldout(final_dir, s)
    summary = {
        "steps": len(rows),
        "heldout_reward_start": round(start_r, 4),
        "heldout_reward_end": round(end_r, 4),
        "heldout_reward_gain": round(end_r - start_r, 4),
        "rollouts_submitted": counts["submitted"],
        "rollouts_accepted": counts["verified"],
        "rollouts_rejected": counts["rejected"],
        # stale_policy: the group aged past the async bound while queued (refused, not slashed)
        "rejected_by_reason": counts["rejected_by_reason"],
        "completions_per_rollout": s.recipe.group_size,
        "attested_units_onchain": attested,
        "workers": s.workers,
        "async_level": s.recipe.async_level,
        "mean_policy_lag": round(sum(r.policy_lag_mean for r in rows) / max(len(rows), 1), 3),
        "wall_seconds": round(time.time() - started, 1),
        "run_dir": str(run_dir),
    }
    report.write_summary(run_dir, summary)
    report.plot_rewards(run_dir, rows, start_r, end_r)
    point_latest(s.runs_dir, run_dir)
    say(
        f"held-out reward {start_r:.3f} -> {end_r:.3f} ({end_r - start_r:+.3f}) in "
        f"{summary['wall_seconds']}s; {attested} units attested on chain"
    )
    say(f"wrote {run_dir / 'summary.json'} and {run_dir / 'reward.png'} (runs/latest)")
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="prime-swarm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="run the whole network locally and train")
    up.add_argument("--steps", type=int)
    up.add_argument("--workers", type=int)
    up.add_argument(
        "--backend",
        dest="worker_backends",
        type=lambda v: [b.strip() for b in v.split(",")],
        help="worker generation backends, cycled over the workers: hf, vllm or e.g. hf,vllm",
    )
    up.add_argument("--runs-dir", type=Path)
    secrets_cmd = sub.add_parser(
        "compose-secrets", help="create the Redis ACL, passwords and keys docker-compose.yml mounts"
    )
    compose_secrets.add_arguments(secrets_cmd)
    args = parser.parse_args(argv)
    if args.command == "compose-secrets":
        sys.exit(compose_secrets.run(args))
    overrides = {k: v for k, v in vars(args).items() if v is not None and k != "command"}
    try:
        settings = LocalNetworkSettings(**overrides)
    except Exception as exc:
        parser.error(str(exc))
    try:
        run(settings)
    except (ProcessFailed, TimeoutError) as exc:
        print(f"prime-swarm: the run failed: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("prime-swarm: interrupted; every process was stopped", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
