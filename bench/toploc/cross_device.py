"""Cross-device honest noise and a CUDA trainer step: run where a CUDA device is available.

A worker generates on the GPU (hf backend, bf16) and proves over its own prefill there; the
validator recomputes that prefill on the CPU, as validators do. Reports the pooled group mantissa
error and the replay gap of these honest groups (the distribution the ("hf", "hf") limits must
clear on mixed hardware), for the tiny model and a ~100M Qwen2 built from a seed, plus the time
of a GRPO step on the GPU and its FSDP2 variant (`fully_shard`, one rank). Prints one JSON object.

    python bench/toploc/cross_device.py [--model DIR] [--groups N]
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch

from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.hf_backend import HFBackend
from prime_swarm.libs.model.io import load_pretrained
from prime_swarm.libs.model.tokenizer import build_tokenizer, prompt_ids
from prime_swarm.libs.rl.envs import get_env
from prime_swarm.libs.rl.grpo import GRPOConfig, Rollout, make_optimizer
from prime_swarm.libs.rollout.calibration import acceptance_for
from prime_swarm.libs.rollout.noise import gumbel_rows, perturbed_scores
from prime_swarm.libs.rollout.recompute import prefill_hidden, recompute
from prime_swarm.libs.toploc import (
    build_proofs_batch,
    compare_hidden,
    group_contexts,
    pooled_chunk_err,
    pooled_mant_err_mean,
    verify_proofs_batch,
)

LARGE_ARCH = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "max_position_embeddings": 256,
}


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))], 4)


def honest_noise(
    cpu_lm: CausalLM, groups: int, batch: int = 8, worker: str = "cuda", validator: str = "cpu"
) -> dict[str, object]:
    # Each side its own copy of the same weights, on its own device.
    gpu_lm = CausalLM(copy.deepcopy(cpu_lm.module).to(worker), cpu_lm.tokenizer)
    if validator != "cpu":
        cpu_lm = CausalLM(copy.deepcopy(cpu_lm.module).to(validator), cpu_lm.tokenizer)
    env = get_env("reverse")
    acc = acceptance_for("hf")
    assert acc is not None
    backend = HFBackend("bf16")
    pools: list[float] = []
    ratios: list[float] = []
    gaps: list[float] = []
    exact = 0
    for b in range(groups // batch):
        tasks = env.sample_tasks(b, batch, "train")
        prompts = [prompt_ids(cpu_lm.tokenizer, t.prompt) for t in tasks]
        seeds = [b * 1000 + i for i in range(batch)]
        out = backend.generate(
            gpu_lm, prompts, seeds, group_size=8, max_new_tokens=8, temperature=1.0
        )
        seqs = [(p, c.token_ids) for p, g in zip(prompts, out, strict=True) for c in g]
        # The validator batches differently: two halves, in reverse order.
        half = len(seqs) // 2
        ours = prefill_hidden(cpu_lm, seqs[half:], "bf16") + prefill_hidden(
            cpu_lm, seqs[:half], "bf16"
        )
        ours = ours[len(seqs) - half :] + ours[: len(seqs) - half]
        head = cpu_lm.cast("bf16")
        for gi, (seed, g) in enumerate(zip(seeds, out, strict=True)):
            ctx = group_contexts("model", f"lease-{b}-{gi}", [c.token_ids for c in g])
            # The worker's proof prefill, on its own device (libs/rollout/answer.py).
            theirs = prefill_hidden(gpu_lm, [(prompts[gi], c.token_ids) for c in g], "bf16")
            proofs = build_proofs_batch(theirs, ctx)
            mine = ours[gi * 8 : (gi + 1) * 8]
            res = verify_proofs_batch(mine, proofs, ctx, acc.gross)
            pools.append(pooled_mant_err_mean(res))
            exact += all(torch.equal(a, t) for a, t in zip(mine, theirs, strict=True))
            # The first check's statistic: against the validator's fp32 reference, over its own
            # bf16 noise on the same points (libs/rollout/verify.measure_group).
            recs = recompute(cpu_lm, [(prompts[gi], c.token_ids) for c in g], "bf16")
            worker_err = pooled_mant_err_mean(
                verify_proofs_batch([r.reference for r in recs], proofs, ctx, acc.gross)
            )
            noise_err = pooled_chunk_err(
                st for r in recs for st in compare_hidden(r.reference, r.declared)
            )
            ratios.append(worker_err / max(noise_err, acc.noise_floor_ulp))
            for j, (c, h) in enumerate(zip(g, mine, strict=True)):
                logits = head.head_logits(h.to(head.device))
                rows = [(seed, j, k) for k in range(len(c.token_ids))]
                noise = gumbel_rows(rows, logits.shape[-1], logits.device)
                scores = perturbed_scores(logits, 1.0, noise)
                tok = torch.tensor(c.token_ids, device=logits.device)
                gap = scores.max(-1).values - scores.gather(-1, tok[:, None]).squeeze(-1)
                gaps.append(float(gap.max()))
    return {
        "groups": len(pools),
        "groups_bit_exact": exact,
        "pooled_mant_err": {"p50": _pct(pools, 0.5), "p99": _pct(pools, 0.99), "max": max(pools)},
        "replay_gap": {"p50": _pct(gaps, 0.5), "p99": _pct(gaps, 0.99), "max": max(gaps)},
        "weight_ratio": {"p50": _pct(ratios, 0.5), "p99": _pct(ratios, 0.99), "max": max(ratios)},
        "weight_ratio_band": acc.weight_ratio.model_dump(),
        "first_check_not_accepted": sum(acc.weight_ratio.outcome(r) != "accept" for r in ratios),
        # Same-precision (second opinion) limits: what a CPU recheck of GPU work would face.
        "limit_group_mant_err": acc.recheck.max_group_mant_err,
        "limit_replay": acc.recheck.max_replay_gap,
        "rejected_at_limits": sum(p > acc.recheck.max_group_mant_err for p in pools)
        + sum(g > acc.recheck.max_replay_gap for g in gaps),
    }


def step_timing(arch: dict[str, int], fsdp: bool, steps: int = 5) -> dict[str, float]:
    from prime_swarm.libs.rl.distributed import DistContext, distributed_step, shard_model

    lm = CausalLM(init_tiny_model(0, **arch).to("cuda"), build_tokenizer())
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
    distributed_step(lm, opt, batch, cfg, ctx)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        distributed_step(lm, opt, batch, cfg, ctx)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for grp in batch for r in grp)
    return {"step_s": round(dt, 4), "tokens_per_s": round(tokens / dt), "sequences": 256}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", type=Path, help="tiny model directory (default: seed 0 init)")
    ap.add_argument("--groups", type=int, default=200)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA device"
    torch.set_num_threads(4)
    tiny = (
        load_pretrained(args.model)
        if args.model
        else CausalLM(init_tiny_model(0), build_tokenizer())
    )
    large = CausalLM(init_tiny_model(1, **LARGE_ARCH), build_tokenizer())
    result: dict[str, object] = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "tiny": honest_noise(tiny, args.groups),
        "large_params": large.num_parameters(),
        "large": honest_noise(large, args.groups // 2),
        "large_gpu_validator": honest_noise(large, args.groups // 2, validator="cuda"),
        "large_cpu_only": honest_noise(large, args.groups // 4, worker="cpu"),
    }
    if torch.distributed.is_available():
        import os

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        torch.distributed.init_process_group("nccl", rank=0, world_size=1)
        result["step_large_plain"] = step_timing(LARGE_ARCH, fsdp=False)
        result["step_large_fsdp2"] = step_timing(LARGE_ARCH, fsdp=True)
        torch.distributed.destroy_process_group()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
