"""`make bench-worker`: what a contributor's machine yields through `prime-worker`, against the
same engine generating the same leases with nothing else to do; bench/results/worker.json.

    .venv/bin/python -m bench.worker [--engines hf,vllm] [--rounds N] [--leases N]

The worker's path is the project's own (libs/rollout/answer.start_leases, then each
submission's result: generation with hidden-state capture, the proof prefill and the proofs,
the submissions built; a round's batches back to back, each batch's proofs built in the
background while the next generates, as the worker's loop runs), on SmolLM2-135M-Instruct in
bf16. The plain path is the engine's own
generation of the same prompts, group size, token cap and temperature: transformers'
`generate` for `hf`, vLLM's `LLM.generate` for `vllm`. Rounds alternate the two on the same
leases; `worker_vs_plain` is the ratio of generated tokens per second (completions end at EOS,
so their counts per second differ with the lengths drawn), beside completions per second.
`where_the_time_goes` splits the worker's time into generation and proofs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from bench.toploc.models import new_lease, specs
from bench.toploc.results_file import write_results
from prime_swarm.libs.model.backend import make_backend
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.rollout.answer import ProofBuilder, ProofTimer, start_leases

OUT = Path(__file__).resolve().parents[2] / "bench" / "results" / "worker.json"


def plain_hf(lm, prompts: list[list[int]], group: int, max_new: int) -> int:  # noqa: ANN001
    """transformers' own sampling of every prompt's group: new tokens generated."""
    pad = lm.tokenizer.pad_token_id or lm.tokenizer.eos_token_id
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        out = lm.module.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
            top_p=1.0, max_new_tokens=max_new, num_return_sequences=group, pad_token_id=pad,
        )  # fmt: skip
    new = out[:, width:]
    eos = lm.tokenizer.eos_token_id
    # Tokens up to and including the first EOS (what the worker's branches count).
    done = (new == eos).int().cumsum(1)
    return int(((done == 0) | ((done == 1) & (new == eos))).sum())


class PlainVLLM:
    def __init__(self, model_dir: Path) -> None:
        import vllm

        self.vllm = vllm
        self.llm = vllm.LLM(model=str(model_dir), dtype="bfloat16", seed=0)

    def __call__(self, prompts: list[list[int]], group: int, max_new: int, seed: int) -> int:
        params = self.vllm.SamplingParams(n=group, temperature=1.0, max_tokens=max_new, seed=seed)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return sum(len(c.token_ids) for o in outs for c in o.outputs)


def worker_path(
    policy: LoadedPolicy,
    batches: list[list],
    backend,
    builder: ProofBuilder,  # noqa: ANN001
) -> tuple[int, int]:
    """The worker's generation, proofs and submissions of several batches, as its loop runs
    them: each batch's proofs are built in the background while the next one generates.
    (completions, new tokens)."""
    pending = [p for leases in batches for p in start_leases(policy, leases, backend, builder)]
    subs = [p.result() for p in pending]
    return sum(len(s.completions) for s in subs), sum(
        len(c.token_ids) for s in subs for c in s.completions
    )


def measure(
    engine: str, rounds: int, per_round: int, n_leases: int, group: int, max_new: int
) -> dict:
    (s,) = specs(["smollm2"], None)
    s = replace(s, group_size=group, max_new_tokens=max_new)
    policy = LoadedPolicy(1, "0a" * 32, s.lm)
    backend = make_backend(engine, "bf16")
    plain = PlainVLLM(s.lm.source) if engine == "vllm" else None
    builder = ProofBuilder()
    rng = random.Random(0)
    rows = {"worker": [], "plain": []}
    try:
        for r in range(rounds + 1):  # the first round warms both paths up and is not counted
            batches = [[new_lease(s, rng) for _ in range(n_leases)] for _ in range(per_round)]
            t0 = time.perf_counter()
            completions, tokens = worker_path(
                policy, [[lease for lease, _ in b] for b in batches], backend, builder
            )
            t1 = time.perf_counter()
            plain_tokens = 0
            for b in batches:
                prompts = [p for _, p in b]
                if plain is None:
                    plain_tokens += plain_hf(s.lm, prompts, group, max_new)
                else:
                    plain_tokens += plain(prompts, group, max_new, seed=r)
            t2 = time.perf_counter()
            if r == 0:
                builder.timer = ProofTimer()  # the warm-up round's times go
            else:
                rows["worker"].append((t1 - t0, completions, tokens))
                rows["plain"].append((t2 - t1, per_round * n_leases * group, plain_tokens))
            print(f"{engine} round {r}: worker {t1 - t0:.1f} s, plain {t2 - t1:.1f} s", flush=True)
        timer = builder.timer
    finally:
        builder.close()

    def rates(xs: list[tuple[float, int, int]]) -> dict:
        secs = sum(x[0] for x in xs)
        return {
            "seconds": round(secs, 2),
            "completions_per_s": round(sum(x[1] for x in xs) / secs, 3),
            "tokens_per_s": round(sum(x[2] for x in xs) / secs, 2),
        }

    w, p = rates(rows["worker"]), rates(rows["plain"])
    return {
        "worker": w,
        "plain": p,
        "worker_vs_plain": round(w["tokens_per_s"] / p["tokens_per_s"], 3),
        "worker_vs_plain_completions": round(w["completions_per_s"] / p["completions_per_s"], 3),
        "where_the_time_goes": {k: round(v, 2) for k, v in vars(timer).items()
                                if isinstance(v, float)},
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=3, help="batches a round, back to back")
    ap.add_argument("--leases", type=int, default=4, help="leases generated together")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    engines = {
        e: measure(e, args.rounds, args.batches, args.leases, args.group, args.max_new_tokens)
        for e in args.engines.split(",")
    }
    write_results(
        args.out,
        {
            "command": "python -m bench.worker " + " ".join(sys.argv[1:]),
            "model": "SmolLM2-135M-Instruct (GGUF), bf16",
            "shape": {"leases": args.leases, "batches": args.batches, "group": args.group,
                      "max_new_tokens": args.max_new_tokens, "rounds": args.rounds},
            "threads": torch.get_num_threads(),
            "engines": engines,
        },
    )  # fmt: skip
    print(json.dumps({e: r["worker_vs_plain"] for e, r in engines.items()}))


if __name__ == "__main__":
    main()
