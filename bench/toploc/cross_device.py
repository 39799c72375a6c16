"""Verification across devices, run on a CUDA machine: the `cross_device` section of
bench/results/toploc.json.

Workers generate and prove on the GPU (`cuda-hf-bf16`: the `hf` engine in bf16). Every honest
group is judged by a CPU validator (this machine's CPU) and by a GPU validator, through the
validator's own decision (libs/rollout/verify.verify_batch, settled); work either one holds
is settled by a validator of the class the worker declared, as in a pool. The weight cheats
(int8, int4, a 1 %-RMS neighbour; fp8 measured) generate on the GPU too, judged the same way.
On the 104M Qwen2 the CPU stand-in for another device class (`emu-gpu-bf16`,
device_emulator.py) runs against the same CPU validator: the comparison its tuning targets. Also
the time of a GRPO step of the 104M model on the GPU, plain and FSDP2 (one rank).

    python -m bench.toploc.cross_device [--models qwen104m,smollm2] [--groups N]
        [--trials N] [--model DIR] [--out FILE]

Each model's entry replaces the one in --out, the others are kept, so models can be measured in
separate runs. Shapes follow models.py: `models.<model>.pairs.<prover>/<validator>`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.hardware import detect, device_class
from prime_swarm.libs.model.tokenizer import build_tokenizer
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.rl.grpo import GRPOConfig, Rollout, make_optimizer

from .models import (
    LIAR,
    MEASURED_WEIGHTS,
    PROVERS,
    QWEN104M,
    REPO,
    WEIGHT_ATTACKS,
    Validator,
    attacks,
    honest,
    on_device,
    specs,
)
from .results_file import read_results, write_results

WEIGHT_CHEATS = [*WEIGHT_ATTACKS, *(k for k in MEASURED_WEIGHTS if k != LIAR)]


def cross_validators(lm: CausalLM, threads: int) -> list[Validator]:
    """A CPU validator and a GPU validator, each with its own copy of the weights."""
    return [
        Validator("cpu", LoadedPolicy(10, "0a" * 32, lm), threads, device_class("cpu")),
        Validator(
            "cuda",
            LoadedPolicy(10, "0a" * 32, on_device(lm, "cuda")),
            threads,
            device_class("cuda"),
        ),
    ]


def step_timing(fsdp: bool, steps: int = 5) -> dict[str, float]:
    from prime_swarm.libs.rl.distributed import DistContext, shard_model
    from prime_swarm.libs.rl.step import train_step

    lm = CausalLM(init_tiny_model(0, **QWEN104M).to("cuda"), build_tokenizer())
    ctx = DistContext(0, 1, torch.device("cuda"), distributed=fsdp)
    if fsdp:
        lm = shard_model(lm, ctx)
    opt = make_optimizer(lm, lr=1e-6)
    g = torch.Generator().manual_seed(0)
    batch = []
    for _ in range(32):
        prompt = [257, *torch.randint(0, 256, (48,), generator=g).tolist()]
        group = []
        for j in range(8):
            comp = torch.randint(0, 256, (64,), generator=g).tolist()
            group.append(Rollout(prompt, comp, [-5.0] * len(comp), float(j % 3), 1.0, None))
        batch.append(group)
    cfg = GRPOConfig()
    train_step(lm, opt, batch, cfg, ctx)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        train_step(lm, opt, batch, cfg, ctx)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for grp in batch for r in grp)
    return {"step_s": round(dt, 4), "tokens_per_s": round(tokens / dt), "sequences": 256}


def steps() -> dict[str, dict[str, float]]:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    try:
        return {"plain": step_timing(fsdp=False), "fsdp2": step_timing(fsdp=True)}
    finally:
        torch.distributed.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen104m,smollm2")
    ap.add_argument("--model", type=Path, default=None, help="a model directory for 'smollm2'")
    ap.add_argument("--groups", type=int, default=100, help="honest groups per prover")
    ap.add_argument("--emu-groups", type=int, default=40, help="honest groups of the emulator")
    ap.add_argument("--trials", type=int, default=10, help="trials per weight cheat")
    ap.add_argument("--threads", type=int, default=8, help="the CPU validator's threads")
    ap.add_argument("--step-timing", action="store_true", help="time GRPO steps on the GPU too")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "toploc.json")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA device"
    torch.set_num_threads(2)
    rng = random.Random(7)
    doc = read_results(args.out)
    # An entry of another shape is an older bench's, measured with another statistic: replaced.
    section = doc.get("cross_device") if "models" in doc.get("cross_device", {}) else {}
    section.update(
        device=detect("cuda").describe(),
        device_class=device_class("cuda"),
        cpu=detect("cpu").describe(),
        torch=torch.__version__,
        command="python -m bench.toploc.cross_device " + " ".join(sys.argv[1:]),
    )
    section.setdefault("models", {})
    for spec in specs(args.models.split(","), args.model):
        t0 = time.time()
        vals = cross_validators(spec.lm, args.threads)
        provers = ["cuda-hf-bf16"] + (["emu-gpu-bf16"] if spec.name == "qwen104m" else [])
        pairs = {}
        for prover in provers:
            judged_by = vals if prover == "cuda-hf-bf16" else vals[:1]
            n = args.groups if prover == "cuda-hf-bf16" else args.emu_groups
            pairs.update(honest(spec, n, rng, [prover], judged_by))
        by_validator = attacks(spec, args.trials, rng, PROVERS["cuda-hf-bf16"], vals, WEIGHT_CHEATS)
        for v, att in by_validator.items():
            pairs[f"cuda-hf-bf16/{v}"]["attacks"] = att
        section["models"][spec.name] = {
            "description": spec.description,
            "layers": spec.lm.module.config.num_hidden_layers,
            "parameters": spec.lm.num_parameters(),
            "pairs": pairs,
            "wall_s": round(time.time() - t0, 1),
        }
        doc["cross_device"] = section
        write_results(args.out, doc)
    if args.step_timing:
        section["grpo_step_qwen104m"] = steps()
    doc["cross_device"] = section
    write_results(args.out, doc)
    print(json.dumps({k: v for k, v in section.items() if k != "models"}))


if __name__ == "__main__":
    main()
