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
`bytes_ratio` (delta bytes / full bytes of the weights, the worst version), `per_version`,
`loopback_speedup` (clients' time to hold the version, full / delta, from relays that hold it)
and `shaped_speedup` (origin, 2 relays and the clients in network namespaces with tc-shaped
links: from the publish until every client holds the version, whole / by delta).

    python -m bench.shardcast.delta [--steps 3] [--clients 4]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from eth_account import Account
from eth_account.signers.local import LocalAccount
from safetensors.torch import save_file

from prime_swarm.libs.environments import load_env
from prime_swarm.libs.localnet.relay import RelayProcess
from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.hf_backend import HFBackend
from prime_swarm.libs.model.io import save_pretrained
from prime_swarm.libs.model.tokenizer import build_tokenizer, decode, prompt_ids
from prime_swarm.libs.rl.grpo import Rollout, make_optimizer
from prime_swarm.libs.rl.step import train_step
from prime_swarm.libs.shardcast import delta, download_version, fetch_manifest, publish_version
from prime_swarm.libs.shardcast.client import HeldFiles, wait_for_version
from prime_swarm.libs.shardcast.relays import RelayPool

from .net import ShapedNamespaces, namespaces_available
from .transfer import PY, ROOT, Procs, wait_clients, wait_http, wait_ready

RESULTS = ROOT / "bench" / "results" / "shardcast.json"
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
    env = load_env("reverse")
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
    train_step(lm, opt, batch)
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


def shaped_run(
    work: Path, dirs: list[Path], trainer: LocalAccount, rate_mbit: int, n_clients: int
) -> dict[str, object]:
    """origin -> 2 relays -> clients, one network namespace each, every link shaped to
    `rate_mbit` both ways. The clients hold v0. Timed from the publish: v1 reaches clients
    fetching by delta (`--held`), then v2 reaches clients fetching whole; each includes the
    relays pulling the version (the delta's shards first, then the full file)."""
    clients = [f"client{i}" for i in range(n_clients)]
    net = ShapedNamespaces(["origin", "relay0", "relay1", *clients], rate_mbit, tag="scd")
    work.mkdir(parents=True, exist_ok=True)
    procs = Procs(work)
    relay = [PY, "-m", "prime_swarm.services.relay"]
    common = ["--trainer", trainer.address, "--keep-versions", "3", "--log-level", "WARNING"]
    net.setup()
    try:
        procs.start("origin", net.prefix("origin") + relay + [
            "origin", "--host", net.host("origin"), "--port", str(net.port("origin")),
            "--data-dir", str(work / "origin"), *common,
        ])  # fmt: skip
        for r in ("relay0", "relay1"):
            procs.start(r, net.prefix(r) + relay + [
                "relay", "--host", net.host(r), "--port", str(net.port(r)),
                "--data-dir", str(work / r), "--parent", net.url("origin"),
                "--poll-interval", "0.1", "--timeout", "30", *common,
            ])  # fmt: skip
        for n in ("origin", "relay0", "relay1"):
            wait_http(net.url(n) + "/healthz", procs, n)
        relays = [x for r in ("relay0", "relay1") for x in ("--relay", net.url(r))]

        def distribute(version: int, held: int | None) -> float:
            started = []
            for c in clients:
                cmd = relay + [
                    "fetch", "--trainer", trainer.address, "--version", str(version),
                    "--out", str(work / c / f"v{version}"), "--wait", "600", "--timeout", "30",
                    "--no-progress", *relays,
                ]  # fmt: skip
                if held is not None:
                    cmd += ["--held", str(work / c / f"v{held}"), "--held-version", str(held)]
                (work / c).mkdir(exist_ok=True)
                name = f"{c}-v{version}"
                started.append((name, procs.start(name, net.prefix(c) + cmd)))
            wait_ready(started, procs)
            t0, wall0 = time.monotonic(), time.time()
            parent = ["--parent-version", str(version - 1), "--parent-dir", str(dirs[version - 1])]
            pub = procs.start(f"publish-v{version}", net.prefix("origin") + [
                PY, str(ROOT / "bench" / "shardcast" / "publish_ours.py"),
                "--origin", net.url("origin"), "--model-dir", str(dirs[version]),
                "--version", str(version), *(parent if version else []),
            ], extra_env={"SC_BENCH_KEY": trainer.key.hex()})  # fmt: skip
            total, _ = wait_clients(started, procs, t0, 900, watch=[(f"publish-v{version}", pub)])
            # Timed from the publish itself, not from the publisher process's start-up.
            m = re.search(r"publish starts at ([0-9.]+)", procs.tail(f"publish-v{version}"))
            return total - (float(m.group(1)) - wall0) if m else total

        def settle(version: int) -> None:
            """Both runs start from idle relays: v1's full file (which delta clients skip) is
            still flowing to the relays when they finish, and v2 would queue behind it."""
            for r in ("relay0", "relay1"):
                wait_for_version(net.url(r), version, timeout_s=300)

        distribute(0, None)  # every client holds v0, untimed
        settle(0)
        delta_s = round(distribute(1, 0), 2)
        settle(1)
        full_s = round(distribute(2, None), 2)
    finally:
        procs.stop_all()
        net.teardown()
    return {
        "rate_mbit_per_node": rate_mbit,
        "delta_s": round(delta_s, 2),
        "full_s": round(full_s, 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--rate-mbit", type=int, default=200, help="shaped links, each way")
    ap.add_argument("--no-shaped", action="store_true", help="skip the tc-shaped run")
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
                prev = cur
        finally:
            pool.shutdown(cancel_futures=True)
            for s in servers:
                s.stop()
        shaped: dict[str, object] = {}
        why = "--no-shaped" if args.no_shaped else namespaces_available()
        if why is None and args.steps >= 2:
            dirs = [work / "ckpt" / f"v{v}" for v in range(3)]
            shaped = shaped_run(work / "shaped", dirs, trainer, args.rate_mbit, args.clients)
            shaped["speedup"] = round(float(shaped["full_s"]) / float(shaped["delta_s"]), 2)
            print(json.dumps(shaped), flush=True)
        else:
            shaped = {"skipped": why or "needs --steps >= 2"}
    ratios = [float(r["bytes_ratio"]) for r in per_version]  # type: ignore[arg-type]
    speedups = [float(r["full_s"]) / float(r["delta_s"]) for r in per_version]  # type: ignore[arg-type]
    section = {
        "model_params": params,
        "bytes_ratio": max(ratios),
        "loopback_speedup": round(min(speedups), 2),
        "shaped_speedup": shaped.get("speedup"),
        "shaped": shaped,
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
        "notes": "loopback: clients fetch from relays that already hold the version (what a "
        "client pays; no bandwidth to save, the rebuild costs about what the transfer does). "
        "shaped: one namespace per node, tc tbf on every link; timed from the publish until "
        "every client holds the version, v1 by delta (clients hold v0), v2 whole.",
    }
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    result["delta"] = section
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in section.items() if k != "per_version"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
