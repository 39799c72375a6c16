"""Cost of the seeded Gumbel noise against a decode step, at a real vocabulary.

A Qwen2.5-0.5B-shaped model (vocab 151936, hidden 896, 24 layers, random weights, bf16) decodes
one token for 64 sequences with a KV cache; the noise for those 64 rows is timed beside it, and so
is the previous implementation (numpy Philox + log per row) as a baseline in the same run:

    .venv/bin/python -m bench.noise [--threads 2] [--layers 24]

Writes bench/results/noise.json. Target: noise <= 5 % of a decode step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.noise import gumbel_rows
from prime_swarm.libs.model.tokenizer import build_tokenizer

REPO = Path(__file__).resolve().parents[2]


def philox_rows(rows: list[tuple[int, int, int]], vocab: int) -> torch.Tensor:
    """The previous noise: numpy Philox keyed by the seed, -log(-log(u)) per token."""
    out = []
    for seed, sample, pos in rows:
        key = np.array([seed & ((1 << 64) - 1), seed >> 64], dtype=np.uint64)
        counter = np.array([0, pos, sample, 0], dtype=np.uint64)
        raw = np.random.Philox(key=key, counter=counter).random_raw(vocab)
        u = ((raw >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
        out.append(torch.from_numpy(-np.log(-np.log(u))).float())
    return torch.stack(out)


def timed(fn, repeats: int) -> list[float]:  # noqa: ANN001
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(REPO / "bench/results/noise.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=args.layers,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    lm = CausalLM(Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval(), build_tokenizer())
    b, vocab = args.batch, cfg.vocab_size
    prompt = torch.randint(0, vocab, (b, 32))
    cache = DynamicCache(config=cfg)
    last = lm.final_hidden(prompt, cache=cache)[:, -1]
    lm.head_logits(last)  # builds the cached fp32 head once, as generation does
    step_no = [0]

    def decode_step() -> None:
        # One token per row through the cache, then the head: what the hf backend does per step.
        token = torch.randint(0, vocab, (b, 1))
        h = lm.final_hidden(token, cache=cache)[:, -1]
        lm.head_logits(h)
        step_no[0] += 1

    def rows() -> list[tuple[int, int, int]]:
        return [(12345, j, step_no[0]) for j in range(b)]

    gumbel_rows(rows(), vocab)  # the table is built once per process
    decode_step()
    decode = timed(decode_step, args.repeats)
    noise = timed(lambda: gumbel_rows(rows(), vocab), args.repeats * 4)
    baseline = timed(lambda: philox_rows(rows(), vocab), args.repeats)
    d, n, p = (statistics.median(x) for x in (decode, noise, baseline))
    result = {
        "vocab": vocab,
        "sequences": b,
        "threads": args.threads,
        "model": f"Qwen2 (hidden 896, {args.layers} layers, bf16, random weights)",
        "decode_step_s": d,
        "noise_s": n,
        "noise_pct_of_decode_step": 100 * n / d,
        "baseline_philox_numpy_s": p,
        "baseline_pct_of_decode_step": 100 * p / d,
        "speedup_vs_baseline": p / n,
        "target_pct": 5.0,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
