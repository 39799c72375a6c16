"""The `delta` section of `make bench-shardcast`: what lossless deltas save on a realistic update.

A Qwen2 of about 113M parameters built from a seed (nothing downloaded) takes GRPO steps on the
reversal task, exactly as the trainer does: completions sampled by the worker's generation
backend, rewards from the environment (plus a small shaping term, so that a model from a seed
has reward variance to learn from), the clipped policy-gradient loss, AdamW at lr 1e-6 on
fp32 master weights. Each version is published in bf16 (the dtype workers load) through a real
origin and two relays, as the full file and as a delta against the version before. Clients that
hold the parent fetch the new version twice from the relays: whole, and by the delta (rebuilt
and checked against the signed hash).

Writes `delta` into bench/results/shardcast.json (other keys kept): `model_params`,
`bytes_ratio` (delta bytes / full bytes of the weights, the worst version), `per_version`, and
`loopback_speedup` (clients' time to hold the version, full / delta, on loopback). Timings
start once the relays hold the version: they measure what a client pays, not the relay tree.

    python bench/shardcast/delta_bench.py [--steps 3] [--clients 4]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from eth_account import Account
from safetensors.torch import save_file

from prime_swarm.libs.localnet.relay import RelayProcess
from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.hf_backend import HFBackend
from prime_swarm.libs.model.io import save_pretrained
from prime_swarm.libs.model.tokenizer import build_tokenizer, decode, prompt_ids
from prime_swarm.libs.rl.envs import get_env
from prime_swarm.libs.rl.grpo import Rollout, grpo_step, make_optimizer
from prime_swarm.libs.shardcast import delta, download_version, fetch_manifest, publish_version
from prime_swarm.libs.shardcast.client import HeldFiles, wait_for_version
from prime_swarm.libs.shardcast.relays import RelayPool

RESULTS = Path(__file__).resolve().parents[1] / "results" / "shardcast.json"
ARCH = {  # about 113M parameters; the same shape as bench/toploc/cross_device.py's model
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "max_position_embeddings": 128,
}
LR = 1e-6
SHARD = 16 * 1024 * 1024


def rl_step(lm: CausalLM, opt: torch.optim.Optimizer, step: int, prompts: int = 8) -> float:
    """One GRPO step on freshly sampled groups; returns the mean reward."""
    env = get_env("reverse")
    tasks = env.sample_tasks(step, prompts, "train")
    ids = [prompt_ids(lm.tokenizer, t.prompt) for t in tasks]
    groups = HFBackend("fp32").generate(
        lm, ids, [1000 * step + i for i in range(prompts)], group_size=4, max_new_tokens=8,
        temperature=1.0,
    )  # fmt: skip
    batch, rewards = [], []
    for task, pid, group in zip(tasks, ids, groups, strict=True):
        rollouts = []
        for g in group:
            text = decode(lm.tokenizer, g.token_ids)
            # The task's score plus a small shaping term (the share of digits, the answer's
            # alphabet): a model from a seed scores 0 on the task itself, and zero-variance
            # groups give no gradient at all.
            r = env.reward(task, text) + 0.1 * sum(c.isdigit() for c in text) / max(len(text), 1)
            rewards.append(r)
            rollouts.append(Rollout(pid, g.token_ids, g.logprobs, r))
        batch.append(rollouts)
    grpo_step(lm, opt, batch)
    return sum(rewards) / len(rewards)


def publish_bf16(lm: CausalLM, first: Path, out: Path) -> Path:
    """The version as workers load it: bf16 weights next to the first version's config and
    tokenizer files (they never change)."""
    out.mkdir(parents=True)
    for f in first.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    cast = {
        k: v.detach().to(torch.bfloat16).contiguous() for k, v in lm.module.state_dict().items()
    }
    save_file(cast, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _download(args: tuple[list[str], int, str, Path, HeldFiles | None]) -> None:
    relays, version, trainer, out, held = args
    download_version(RelayPool(relays), version, out, trainer, timeout_s=60, held=held)


def fetch_all(
    pool: ProcessPoolExecutor,
    relays: list[str],
    version: int,
    trainer: str,
    outs: list[Path],
    held: list[HeldFiles | None],
) -> float:
    """Seconds until every client (a process each, as workers are) holds `version`."""
    started = time.monotonic()
    jobs = [(relays, version, trainer, out, h) for out, h in zip(outs, held, strict=True)]
    list(pool.map(_download, jobs))
    return time.monotonic() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    torch.set_num_threads(2)
    trainer = Account.create()
    lm = CausalLM(init_tiny_model(0, **ARCH), build_tokenizer())
    params = sum(p.numel() for p in lm.module.parameters())
    opt = make_optimizer(lm, lr=LR)
    per_version = []
    with tempfile.TemporaryDirectory(prefix="delta-bench-") as tmp:
        work = Path(tmp)
        servers: list[RelayProcess] = []
        # Client processes started (and their imports paid) before anything is timed.
        pool = ProcessPoolExecutor(args.clients, mp_context=multiprocessing.get_context("spawn"))
        list(pool.map(abs, range(args.clients)))
        try:
            origin = RelayProcess(
                ["origin", "--trainer", trainer.address, "--keep-versions", "3"], work / "origin"
            ).wait_healthy()
            servers.append(origin)
            for i in range(2):
                relay = RelayProcess(
                    ["relay", "--trainer", trainer.address, "--parent", origin.url,
                     "--poll-interval", "0.2", "--keep-versions", "3"],
                    work / f"relay{i}",
                )  # fmt: skip
                servers.append(relay.wait_healthy())
            relays = [s.url for s in servers[1:]]
            # Config and tokenizer files once; every version's weights are written the same way.
            first = save_pretrained(lm.module, lm.tokenizer, work / "meta")
            (first / "model.safetensors").unlink()
            prev = publish_bf16(lm, first, work / "ckpt" / "v0")
            publish_version(origin.url, prev, 0, None, trainer, SHARD, 120.0)
            for v in range(1, args.steps + 1):
                t0 = time.monotonic()
                reward = rl_step(lm, opt, v)
                step_s = time.monotonic() - t0
                cur = publish_bf16(lm, first, work / "ckpt" / f"v{v}")
                signed = publish_version(
                    origin.url, cur, v, v - 1, trainer, SHARD, 120.0, parent_dir=prev
                )
                for r in relays:
                    wait_for_version(r, v, timeout_s=120)
                full = (cur / "model.safetensors").stat().st_size
                offered = {d.name: d.delta.size for d in signed.manifest.deltas}
                changed = delta.changed_share(
                    (prev / "model.safetensors").read_bytes(),
                    (cur / "model.safetensors").read_bytes(),
                    samples=1_000_000,
                )
                row: dict[str, object] = {
                    "version": v,
                    "full_bytes": full,
                    "delta_bytes": offered.get("model.safetensors"),
                    "bytes_ratio": round(offered.get("model.safetensors", full) / full, 5),
                    "changed_word_share": round(changed, 5),
                    "mean_reward": round(reward, 4),
                    "rl_step_s": round(step_s, 2),
                }
                # Every client holds the parent, as a worker does between versions.
                parents = [work / f"c{i}" / f"v{v - 1}" for i in range(args.clients)]
                fetch_all(pool, relays, v - 1, trainer.address, parents, [None] * args.clients)
                held_manifest = fetch_manifest(relays, v - 1, trainer.address).manifest
                held = [HeldFiles(p, held_manifest) for p in parents]
                row["full_s"] = round(
                    fetch_all(
                        pool, relays, v, trainer.address,
                        [work / f"c{i}" / f"v{v}-full" for i in range(args.clients)],
                        [None] * args.clients,
                    ),
                    3,
                )  # fmt: skip
                row["delta_s"] = round(
                    fetch_all(
                        pool, relays, v, trainer.address,
                        [work / f"c{i}" / f"v{v}-delta" for i in range(args.clients)], held,
                    ),
                    3,
                )  # fmt: skip
                for i in range(args.clients):
                    shutil.rmtree(work / f"c{i}", ignore_errors=True)
                print(json.dumps(row), flush=True)
                per_version.append(row)
                shutil.rmtree(prev)
                prev = cur
        finally:
            pool.shutdown(cancel_futures=True)
            for s in servers:
                s.stop()
    ratios = [float(r["bytes_ratio"]) for r in per_version]  # type: ignore[arg-type]
    speedups = [float(r["full_s"]) / float(r["delta_s"]) for r in per_version]  # type: ignore[arg-type]
    section = {
        "model_params": params,
        "bytes_ratio": max(ratios),
        "loopback_speedup": round(min(speedups), 2),
        "shaped_speedup": None,
        "per_version": per_version,
        "config": {
            "arch": ARCH,
            "lr": LR,
            "optimizer": "AdamW, fp32 master weights",
            "published_dtype": "bf16",
            "clients": args.clients,
            "relays": 2,
            "loss": "GRPO (clipped policy gradient) on sampled reversal-task groups",
        },  # fmt: skip
        "notes": "loopback times start once both relays hold the version (what a client pays); "
        "shaped_speedup is not measured yet (the tc-shaped topology of shardcast_bench.py "
        "does not run the delta path).",
    }
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    result["delta"] = section
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in section.items() if k != "per_version"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
