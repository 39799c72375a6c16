"""TOPLOC + validator benchmark, end to end on the tiny model: honest work and attacks through the
validator's whole decision, precision variants, the cost of proofs and of validation, and ours
against PyPI toploc 0.1.6.

Runs the validator's real decision path (libs/rollout: admission, prefill, measure, judge) in
process on real generations of both prover engines, the hf backend and the vllm backend, each
checked by the validator's transformers prefill, and writes bench/results/toploc.json (the
sections other TOPLOC benches write are kept):

    .venv/bin/python -m bench.toploc [--honest 1000] [--trials 50] [--no-reference]

Each engine pair (prover engine / validator engine) has its own section under `engine_pairs`:
honest rollouts with their false rejections, and every attack run with that engine as the
cheater's, with how many were detected and why. vLLM patches torch.set_num_threads away once its
engine starts, so everything that varies thread counts (the hf sections) runs first.

Honest rollouts vary what honestly varies between a worker and a validator: the worker's batch
size and composition (which leases share a KV-cached decode), the thread count, and the KV-cached
decode itself against the validator's full prefill, which re-batches them differently again;
every attack is a fresh lease cheated in one way. The limits of libs/rollout/calibration.py are
set from one bench, bench/toploc/models.py (the `models` section: every statistic's honest
spread and weakest cheat per model and engine pair); this one only checks them end to end.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from prime_swarm.libs.environments import load_env
from prime_swarm.libs.model.backend import Generation, GenerationBackend
from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.forward import forward_completions
from prime_swarm.libs.model.hardware import device_class
from prime_swarm.libs.model.hf_backend import HFBackend
from prime_swarm.libs.model.io import load_pretrained, save_pretrained
from prime_swarm.libs.model.tokenizer import build_tokenizer, decode, prompt_ids
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.rollout import verify
from prime_swarm.libs.rollout.admission import Refusal, check_admission
from prime_swarm.libs.rollout.calibration import Acceptance, acceptance_for
from prime_swarm.libs.rollout.recipe import Recipe
from prime_swarm.libs.rollout.recompute import prefill_hidden
from prime_swarm.libs.toploc import (
    ProofContext,
    build_proofs_batch,
    group_contexts,
    verify_proofs_batch,
)
from prime_swarm.libs.warmstart import warm_start
from prime_swarm.protocol.messages import (
    CompletionSample,
    Lease,
    RolloutSubmission,
    SamplingParams,
    SubmittedRollout,
)

from .cheats import REQUIRED, neighbour, perturbed, quantized
from .results_file import read_results, write_results

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "models"
REF_PY = REPO / "bench" / ".venv-toploc-ref" / "bin" / "python"
WORKER = "0x" + "ab" * 20
OTHER_WORKER = "0x" + "cd" * 20
CURRENT = 10  # the trainer's step; the claimed policy is v10
RECIPE = Recipe()
ENV = load_env(RECIPE.env)
HF = HFBackend("bf16")  # the worker default; fp16 and fp32 run as precision variants
VALIDATOR_ENGINE = "hf"  # the validator always recomputes with a transformers prefill
TINY_DESCRIPTION = "warm-started tiny Qwen2 (2 layers, hidden 128, 4/2 heads, byte-level BPE)"
OTHER_SECTIONS = ("models", "multi_turn", "cross_device")


# --------------------------------------------------------------------------- models
def accept(backend: str) -> Acceptance:
    a = acceptance_for(backend)
    if a is None:
        raise SystemExit(f"no calibrated limits for prover engine {backend!r}")
    return a


def models(base_dir: Path | None) -> dict[str, LoadedPolicy]:
    base = base_dir or warm_start(0, CACHE / "warm-seed0-steps400", seed=0)
    far = warm_start(0, CACHE / "warm-seed0-steps60", seed=0, steps=60)
    lm = load_pretrained(base)
    tok = lm.tokenizer
    eos = min(lm.eos_ids)
    # v8, v9, v10: two further optimizer steps at an RL-sized learning rate, like trainer steps.
    chain = [copy.deepcopy(lm)]
    opt = torch.optim.AdamW(lm.module.parameters(), lr=5e-4, weight_decay=0.0)
    lm.module.train()
    for step in range(2):
        tasks = ENV.sample_tasks(777 + step, 64, "train")
        pairs = [
            (
                prompt_ids(tok, t.prompt),
                [*tok(t.answer, add_special_tokens=False)["input_ids"], eos],
            )
            for t in tasks
        ]
        logits, _, targets, mask = forward_completions(lm, pairs)
        loss = torch.nn.functional.cross_entropy(logits[mask], targets[mask])
        opt.zero_grad()
        loss.backward()
        opt.step()
        chain.append(copy.deepcopy(lm))
    for c in chain:
        c.module.eval()
    v10 = chain[2]
    lms = {
        "v8": chain[0],
        "v9": chain[1],
        "v10": v10,
        "far": load_pretrained(far),
        "other_seed": CausalLM(init_tiny_model(1), build_tokenizer()),
        "int8": perturbed(v10, quantized(8)),
        "int4": perturbed(v10, quantized(4)),
        "neighbour_1pct": perturbed(v10, neighbour(0.01)),
    }
    out = {}
    for name, m in lms.items():
        # Engines that load weights themselves (vLLM) read each model from its directory.
        m.source = save_pretrained(m, m.tokenizer, CACHE / "bench-toploc" / name).resolve()
        version = 8 if name == "v8" else 9 if name == "v9" else 10
        out[name] = LoadedPolicy(version, f"{version:02x}" * 32, m)
    return out


# --------------------------------------------------------------------------- leases
_lease_no = 0


def new_lease(rng: random.Random) -> Lease:
    global _lease_no
    _lease_no += 1
    task = ENV.task_from_id(f"{ENV.name}/train/{rng.randrange(10**6)}")
    return Lease(
        lease_id=f"lease-{_lease_no}",
        worker=WORKER,
        pool_id=1,
        work_id=0,
        env=ENV.name,
        task_id=task.task_id,
        prompt=task.prompt,
        group_size=RECIPE.group_size,
        sampling=SamplingParams(
            temperature=RECIPE.temperature, max_new_tokens=RECIPE.max_new_tokens
        ),
        seed=rng.randrange(1 << 62),
        min_policy_version=8,
        expires_at=time.time() + 3600,
    )


@dataclass
class Generated:
    lease: Lease
    prompt_ids: list[int]
    completions: list[Proved]
    precision: str
    backend: str


@dataclass
class Proved:
    """A generation with the states its proof commits to: the worker's proof prefill."""

    token_ids: list[int]
    finish_reason: str
    logprobs: list[float]
    hidden: torch.Tensor


def proved(lm: CausalLM, prompt: list[int], gens: list[Generation], precision: str) -> list[Proved]:
    """The worker's proof prefill (libs/rollout/answer.py) over generated completions."""
    hiddens = prefill_hidden(lm, [(prompt, g.token_ids) for g in gens], precision)
    return [
        Proved(g.token_ids, g.finish_reason, g.logprobs, h)
        for g, h in zip(gens, hiddens, strict=True)
    ]


def generate_for(
    policy: LoadedPolicy,
    leases: list[Lease],
    backend: GenerationBackend = HF,
    seeds: list[int] | None = None,
    prompts: list[str] | None = None,
) -> tuple[list[Generated], float]:
    tok = policy.lm.tokenizer
    texts = prompts or [lease.prompt for lease in leases]
    pids = [prompt_ids(tok, t) for t in texts]
    t0 = time.perf_counter()
    groups = backend.generate(
        policy.lm,
        pids,
        seeds or [lease.seed for lease in leases],
        group_size=leases[0].group_size,
        max_new_tokens=leases[0].sampling.max_new_tokens,
        temperature=leases[0].sampling.temperature,
    )
    dt = time.perf_counter() - t0
    return [
        Generated(
            lease, p, proved(policy.lm, p, g, backend.precision), backend.precision, backend.name
        )
        for lease, p, g in zip(leases, pids, groups, strict=True)
    ], dt


def submit(
    gen: Generated, claimed: LoadedPolicy, hiddens: list[torch.Tensor] | None = None
) -> tuple[SubmittedRollout, float]:
    """Proofs over the captured hidden states, bound to the claimed policy; claims rewards."""
    lease = gen.lease
    ctxs = group_contexts(
        claimed.model_hash, lease.lease_id, [c.token_ids for c in gen.completions]
    )
    t0 = time.perf_counter()
    proofs = build_proofs_batch(hiddens or [c.hidden for c in gen.completions], ctxs)
    dt = time.perf_counter() - t0
    task = ENV.task_from_id(lease.task_id)
    samples = [
        CompletionSample(
            token_ids=c.token_ids,
            finish_reason=c.finish_reason,
            proof=p,
            claimed_reward=ENV.reward(task, decode(claimed.lm.tokenizer, c.token_ids)),
        )
        for c, p in zip(gen.completions, proofs, strict=True)
    ]
    sub = RolloutSubmission(
        lease_id=lease.lease_id,
        worker=lease.worker,
        pool_id=1,
        task_id=lease.task_id,
        policy_version=claimed.version,
        backend=gen.backend,  # type: ignore[arg-type]
        precision=gen.precision,  # type: ignore[arg-type]
        device_class=HERE,  # what a worker on this machine declares (libs/rollout/answer.py)
        prompt_token_ids=gen.prompt_ids,
        completions=samples,
    )
    return SubmittedRollout(submission_id=f"sub-{lease.lease_id}", lease=lease, submission=sub), dt


# --------------------------------------------------------------------------- the validator
HERE = device_class("cpu")
"""This machine's device class: every worker and the validator of this bench run here."""


class Validator:
    """The service's decision path, in process: admission, duplicate detection by content hash
    (SET NX semantics, with a dict for Redis), one batched prefill per policy version, then
    measure + judge."""

    def __init__(self, policies: dict[int, LoadedPolicy]) -> None:
        self.policies = policies
        self.seen: dict[str, str] = {}

    def validate(self, entries: list[SubmittedRollout]) -> list[str]:
        verdicts: list[str] = [""] * len(entries)
        live = []
        for i, e in enumerate(entries):
            try:
                check_admission(e.submission, e.lease, CURRENT, RECIPE.async_level)
                held = self.seen.setdefault(e.submission.content_hash(), e.submission_id)
                if held != e.submission_id:
                    raise Refusal("duplicate", "seen before")
                policy = self.policies[e.submission.policy_version]
                verify.check_prompt(e, policy.lm)
                verify.check_shapes(e, policy.lm)
                live.append(i)
            except Refusal as rej:
                verdicts[i] = rej.reason
        # The validator's own batch decision (one recomputation per version and precision).
        works = [
            verify.Work(entries[i], self.policies[entries[i].submission.policy_version])
            for i in live
        ]
        # As the validator service runs: its own device class known, so that work declared
        # from it is also held to its declared-precision numbers and a failed recheck slashes.
        for i, d in zip(live, verify.verify_batch(works, 1e-6, device_class=HERE), strict=True):
            verdicts[i] = "accepted" if d.refusal is None else d.refusal.reason
        return verdicts


# --------------------------------------------------------------------------- honest
def honest_run(
    p: dict[str, LoadedPolicy],
    validator: Validator,
    n_target: int,
    rng: random.Random,
    backend: GenerationBackend = HF,
) -> dict:
    v10 = p["v10"]
    gen_s = prove_s = 0.0
    gen_tokens = 0
    produced: list[SubmittedRollout] = []
    configs = []
    batch_sizes = [1, 2, 3, 5, 8, 13, 16]
    threads = [1, 2] if backend.name == "hf" else [torch.get_num_threads()]
    while len(produced) < n_target:
        bs, th = rng.choice(batch_sizes), rng.choice(threads)
        torch.set_num_threads(th)
        gens, dt = generate_for(v10, [new_lease(rng) for _ in range(bs)], backend)
        gen_s += dt
        gen_tokens += sum(len(c.token_ids) for g in gens for c in g.completions)
        for g in gens:
            e, pdt = submit(g, v10)
            prove_s += pdt
            produced.append(e)
        configs.append((bs, th))
    produced = produced[:n_target]
    # The validator re-batches differently: shuffled, other batch sizes and thread counts.
    order = list(range(len(produced)))
    rng.shuffle(order)
    verdicts: dict[int, str] = {}
    val_s = 0.0
    val_tokens = 0
    i = 0
    while i < len(order):
        bs = rng.choice([1, 4, 16, 32])
        torch.set_num_threads(rng.choice(threads))
        idx = order[i : i + bs]
        t0 = time.perf_counter()
        out = validator.validate([produced[j] for j in idx])
        val_s += time.perf_counter() - t0
        val_tokens += sum(len(c.token_ids) for j in idx for c in produced[j].submission.completions)
        verdicts.update(zip(idx, out, strict=True))
        i += bs
    rejected = {j: v for j, v in verdicts.items() if v != "accepted"}
    return {
        "rollouts": len(produced),
        "completions": sum(len(e.submission.completions) for e in produced),
        "false_rejections": len(rejected),
        "false_rejection_reasons": sorted({str(v) for v in rejected.values()}),
        "gen_batch_sizes": sorted({c[0] for c in configs}),
        "thread_counts": threads,
        "gen_s": gen_s,
        "gen_tokens": gen_tokens,
        "prove_s": prove_s,
        "val_s": val_s,
        "val_tokens": val_tokens,
        "proof_bytes": sum(len(c.proof) for e in produced for c in e.submission.completions),
        "produced": produced,
    }


def variant_run(
    p: dict[str, LoadedPolicy], validator: Validator, precision: str, n: int, rng: random.Random
) -> dict:
    """A worker computing in another precision: more work, not less; must be accepted."""
    backend = HFBackend(precision)
    verdicts = []
    for _ in range(n):
        (g,), _ = generate_for(p["v10"], [new_lease(rng)], backend)
        e = submit(g, p["v10"])[0]
        verdicts += validator.validate([e])
    rejected = [v for v in verdicts if v != "accepted"]
    return {"rollouts": n, "false_rejections": len(rejected), "reasons": sorted(set(rejected))}


# --------------------------------------------------------------------------- attacks
def with_completion(e: SubmittedRollout, i: int, **update: object) -> SubmittedRollout:
    comps = list(e.submission.completions)
    comps[i] = comps[i].model_copy(update=update)
    sub = e.submission.model_copy(update={"completions": comps})
    return e.model_copy(update={"submission": sub})


def honest_one(
    p: dict[str, LoadedPolicy], rng: random.Random, backend: GenerationBackend = HF
) -> tuple[Generated, SubmittedRollout]:
    (g,), _ = generate_for(p["v10"], [new_lease(rng)], backend)
    return g, submit(g, p["v10"])[0]


def own_sampler(
    policy: LoadedPolicy, lease: Lease, backend: GenerationBackend, rng: random.Random
) -> Generated:
    """The right model and valid proofs, but the engine's own sampler instead of the seeded
    noise: hf samples with another seed's noise; vLLM samples natively (its own seeded
    multinomial at the lease's temperature) and proves with an exact transformers prefill."""
    if backend.name == "hf":
        (g,), _ = generate_for(policy, [lease], backend, seeds=[rng.randrange(1 << 62)])
        return g
    from vllm import SamplingParams as VSampling

    lm = policy.lm
    pids = prompt_ids(lm.tokenizer, lease.prompt)
    engine = backend.engine(lm)  # type: ignore[attr-defined]
    (out,) = engine.generate(
        [{"prompt_token_ids": pids}],
        VSampling(
            n=lease.group_size,
            temperature=lease.sampling.temperature,
            max_tokens=lease.sampling.max_new_tokens,
            stop_token_ids=sorted(lm.eos_ids),
            seed=rng.randrange(1 << 31),
            detokenize=False,
        ),
        use_tqdm=False,
    )
    toks = [list(c.token_ids) for c in out.outputs]
    hiddens = prefill_hidden(lm, [(pids, t) for t in toks], backend.precision)
    comps = [
        Proved(t, "eos" if t[-1] in lm.eos_ids else "length", [0.0] * len(t), h)
        for t, h in zip(toks, hiddens, strict=True)
    ]
    return Generated(lease, pids, comps, backend.precision, backend.name)


def forge_proof(
    e: SubmittedRollout, g: Generated, kind: str, rng: random.Random
) -> SubmittedRollout:
    i = rng.randrange(len(e.submission.completions))
    proof = bytearray(e.submission.completions[i].proof)
    if kind == "modulus_zero":
        proof[32:34] = b"\x00\x00"
    elif kind == "flipped_signs":
        c = g.completions[i]
        ctx = ProofContext(
            f"{e.submission.policy_version:02x}" * 32, e.lease.lease_id, i, c.token_ids
        )
        proof = bytearray(build_proofs_batch([-c.hidden], [ctx])[0])
    elif kind == "garbage":
        proof = bytearray(rng.randbytes(len(proof)))
    elif kind == "truncated_bytes":
        proof = proof[: rng.randrange(len(proof))]
    elif kind == "random_coefficients":
        body = np.frombuffer(bytes(proof[34:]), dtype="<u2").copy()
        body[:] = [rng.randrange(65497) for _ in range(body.size)]
        proof[34:] = body.tobytes()
    elif kind == "other_completion":
        j = (i + 1) % len(e.submission.completions)
        proof = bytearray(e.submission.completions[j].proof)
        if e.submission.completions[j].token_ids == e.submission.completions[i].token_ids:
            proof[40] ^= 0xFF
    elif kind == "header_context_rewritten":
        proof[16:32] = rng.randbytes(16)
    elif kind == "huge_header":
        proof[8:12] = (1 << 31).to_bytes(4, "little")
    return with_completion(e, i, proof=bytes(proof))


FORGERIES = [
    "modulus_zero",
    "flipped_signs",
    "garbage",
    "truncated_bytes",
    "random_coefficients",
    "other_completion",
    "header_context_rewritten",
    "huge_header",
]
# Generate with these weights, claim v10: each must be told from honest noise.
WRONG_WEIGHTS = {
    "different_model_other_checkpoint": "far",
    "different_model_other_seed": "other_seed",
    "quantized_int8": "int8",
    "quantized_int4": "int4",
    "finetuned_neighbour_1pct_rms": "neighbour_1pct",
    "older_weights_1": "v9",
    "older_weights_2": "v8",
}


def attack_entries(
    name: str, p: dict[str, LoadedPolicy], rng: random.Random, n: int, backend: GenerationBackend
) -> list:
    """``n`` cheating submissions of kind ``name`` generated with ``backend``."""
    v10 = p["v10"]
    out: list = []
    vocab = v10.lm.vocab_size
    for t in range(n):
        if name in WRONG_WEIGHTS:
            (g,), _ = generate_for(p[WRONG_WEIGHTS[name]], [new_lease(rng)], backend)
            out.append(submit(g, v10)[0])
        elif name == "tampered_prompt":
            lease = new_lease(rng)
            easy = ENV.task_from_id(f"{ENV.name}/train/{rng.randrange(10**6)}").prompt
            (g,), _ = generate_for(v10, [lease], backend, prompts=[easy])
            e = submit(g, v10)[0]
            if t % 2:  # claim the leased prompt's tokens for a generation on another prompt
                pids = prompt_ids(v10.lm.tokenizer, lease.prompt)
                sub = e.submission.model_copy(update={"prompt_token_ids": pids})
                e = e.model_copy(update={"submission": sub})
            out.append(e)
        elif name == "tampered_completion_token":
            _, e = honest_one(p, rng, backend)
            i = rng.randrange(len(e.submission.completions))
            toks = list(e.submission.completions[i].token_ids)
            pos = rng.randrange(len(toks))
            toks[pos] = rng.choice([t for t in range(vocab - 3) if t != toks[pos]])
            out.append(with_completion(e, i, token_ids=toks))
        elif name == "truncated_completion":
            _, e = honest_one(p, rng, backend)
            long = [i for i, c in enumerate(e.submission.completions) if len(c.token_ids) > 1]
            i = rng.choice(long)
            toks = e.submission.completions[i].token_ids
            cut = toks[: rng.randrange(1, len(toks))]
            fr = "eos" if t % 2 else "length"
            out.append(with_completion(e, i, token_ids=cut, finish_reason=fr))
        elif name == "sampling_ignores_seed":
            out.append(submit(own_sampler(v10, new_lease(rng), backend, rng), v10)[0])
        elif name == "inflated_reward":
            _, e = honest_one(p, rng, backend)
            i = rng.randrange(len(e.submission.completions))
            c = e.submission.completions[i]
            out.append(with_completion(e, i, claimed_reward=(c.claimed_reward or 0) + 0.25))
        elif name == "replayed_submission":
            _, e = honest_one(p, rng, backend)
            out.append(("pair", e))
        elif name == "forged_proof":
            g, e = honest_one(p, rng, backend)
            out.append(forge_proof(e, g, FORGERIES[t % len(FORGERIES)], rng))
    return out


MEASURED = ["older_weights_1", "older_weights_2"]


def run_attack(
    name: str,
    p: dict[str, LoadedPolicy],
    validator: Validator,
    rng: random.Random,
    n: int,
    backend: GenerationBackend = HF,
) -> dict:
    reasons: dict[str, int] = {}
    detected = crashes = 0
    for item in attack_entries(name, p, rng, n, backend):
        if isinstance(item, tuple):  # replay: the original is accepted, then replayed
            e = item[1]
            first = validator.validate([e])[0]
            assert first == "accepted", first
            sub = e.submission.model_copy(update={"worker": OTHER_WORKER})
            lease = e.lease.model_copy(update={"worker": OTHER_WORKER})
            replay = e.model_copy(
                update={
                    "submission_id": "replay-" + e.submission_id,
                    "submission": sub,
                    "lease": lease,
                }
            )
            v = validator.validate([replay])[0]
        else:
            v = validator.validate([item])[0]
        reasons[str(v)] = reasons.get(str(v), 0) + 1
        crashes += str(v).startswith("CRASH")
        detected += v not in ("accepted", "") and not str(v).startswith("CRASH")
    return {"trials": n, "detected": detected, "crashes": crashes, "reasons": reasons}


# --------------------------------------------------------------------------- overhead
def pipelined_overhead(p: dict[str, LoadedPolicy], rng: random.Random, n: int = 60) -> dict:
    """Wall time of answering n leases back to back, proofs on (background thread) vs off."""
    from prime_swarm.libs.rollout.answer import ProofBuilder, start_lease

    torch.set_num_threads(1)
    leases = [new_lease(rng) for _ in range(n)]
    v10 = p["v10"]
    t0 = time.perf_counter()
    for lease in leases:
        generate_for(v10, [lease])
    plain = time.perf_counter() - t0
    builder = ProofBuilder()
    t0 = time.perf_counter()
    pending = None
    for lease in leases:
        job = start_lease(v10, lease, HF, builder)
        if pending is not None:
            pending.result()
        pending = job
    assert pending is not None
    pending.result()
    with_proofs = time.perf_counter() - t0
    builder.close()
    return {
        "leases": n,
        "generate_only_s": plain,
        "generate_and_prove_pipelined_s": with_proofs,
        "critical_path_overhead_pct": 100 * (with_proofs - plain) / plain,
        "prove_thread_s": builder.timer.prove_s,
    }


# --------------------------------------------------------------------------- reference
def reference_block(honest: dict, p: dict[str, LoadedPolicy], rng: random.Random) -> dict:
    """Ours vs PyPI toploc 0.1.6 on identical activations: (a) the tiny model's honest
    generation-vs-prefill pairs, (b) synthetic 4096-wide activations, 64 chunks."""
    if not REF_PY.exists():
        return {"available": False, "why": f"{REF_PY} missing (make bench-toploc builds it)"}
    torch.set_num_threads(2)
    v10 = p["v10"]
    # (a) 64 honest tiny-model sequences of 8 tokens padded into 256-token activations
    pairs_p, pairs_v = [], []
    for e in honest["produced"][:64]:
        seqs = [(e.submission.prompt_token_ids, c.token_ids) for c in e.submission.completions]
        gens, _ = generate_for(v10, [e.lease])
        mine = prefill_hidden(v10.lm, seqs, HF.precision)
        for c, pre in zip(gens[0].completions, mine, strict=True):
            pairs_p.append(c.hidden)
            pairs_v.append(pre)
    tiny_p = [torch.cat(pairs_p)[: 32 * 64]]
    tiny_v = [torch.cat(pairs_v)[: 32 * 64]]
    # (b) synthetic: 64 chunks x 32 tokens x 4096, validator copy perturbed by float noise
    g = torch.Generator().manual_seed(0)
    big = torch.randn(2048, 4096, generator=g)
    big_p = [big.to(torch.bfloat16)]
    big_v = [(big * (1 + 1e-3 * torch.randn(big.shape, generator=g))).to(torch.bfloat16)]
    out: dict = {"available": True, "package": "toploc==0.1.6", "threads": 2}
    with tempfile.TemporaryDirectory() as tmp:
        for label, pv, vv in (
            ("tiny_model_2048x64", tiny_p, tiny_v),
            ("synthetic_2048x4096", big_p, big_v),
        ):
            path = Path(tmp) / f"{label}.pt"
            torch.save({"prover": pv, "validator": vv}, path)
            ref = subprocess.run(
                [str(REF_PY), str(REPO / "bench/toploc/reference_runner.py"), str(path), "2"],
                capture_output=True,
                text=True,
                timeout=600,
            )
            if ref.returncode != 0:
                out[label] = {"reference_error": ref.stderr[-500:]}
                continue
            r = json.loads(ref.stdout.strip().splitlines()[-1])
            ctx = [
                ProofContext("ha" * 32, "ref", i, list(range(t.shape[0]))) for i, t in enumerate(pv)
            ]
            t0 = time.perf_counter()
            ours = build_proofs_batch(pv, ctx)
            ob = time.perf_counter() - t0
            t0 = time.perf_counter()
            res = verify_proofs_batch(vv, ours, ctx, accept("hf").gross)
            ov = time.perf_counter() - t0
            chunks = r["chunks"]
            out[label] = {
                "chunks": chunks,
                "ours_build_s": ob,
                "ours_verify_s": ov,
                "ref_build_s": r["build_s"],
                "ref_verify_s": r["verify_s"],
                "ours_ms_per_chunk": {"build": 1e3 * ob / chunks, "verify": 1e3 * ov / chunks},
                "ref_ms_per_chunk": {
                    "build": 1e3 * r["build_s"] / chunks,
                    "verify": 1e3 * r["verify_s"] / chunks,
                },
                "ours_accepts_honest": all(x.ok for x in res),
                "ref_accepts_honest": r["accepted"] == r["pairs"],
                "ref_torch": r["torch"],
            }
        mod0 = subprocess.run(
            [
                str(REF_PY),
                str(REPO / "bench/toploc/reference_runner.py"),
                "mod0",
                str(Path(tmp) / "tiny_model_2048x64.pt"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        out["ref_modulus_zero"] = (
            json.loads(mod0.stdout.strip().splitlines()[-1])["modulus_zero"]
            if mod0.returncode == 0 and mod0.stdout.strip()
            else f"verifier process died (rc {mod0.returncode}): {mod0.stderr.strip()[-200:]}"
        )
    out["note"] = (
        "Both accept each other's honest inputs in the sense that both accept the same honest "
        "(prover, validator) activation pairs; proof formats differ (ours carries a bound header), "
        "so neither parses the other's bytes."
    )
    return out


def engine_pair(
    backend: GenerationBackend,
    p: dict[str, LoadedPolicy],
    validator: Validator,
    rng: random.Random,
    args: argparse.Namespace,
) -> tuple[dict, dict]:
    """Honest rollouts and every attack with `backend` as the prover's (and the cheater's)
    engine, checked by the transformers validator: the section of one engine pair."""
    accept(backend.name)  # an engine with no limits stops here, before hours of generation
    honest = honest_run(p, validator, args.honest, rng, backend)
    print(
        json.dumps({"engine": backend.name} | {k: v for k, v in honest.items() if k != "produced"}),
        file=sys.stderr,
    )
    attacks = {n: run_attack(n, p, validator, rng, args.trials, backend) for n in REQUIRED}
    measured = {n: run_attack(n, p, validator, rng, args.trials, backend) for n in MEASURED}
    section = {
        "prover_engine": backend.name,
        "validator_engine": VALIDATOR_ENGINE,
        "precision": backend.precision,
        "honest": {
            "rollouts": honest["rollouts"],
            "completions": honest["completions"],
            "false_rejections": honest["false_rejections"],
            "false_rejection_reasons": honest["false_rejection_reasons"],
            "gen_batch_sizes": honest["gen_batch_sizes"],
            "thread_counts": honest["thread_counts"],
            "gen_s_per_token": honest["gen_s"] / honest["gen_tokens"],
            "validate_s_per_token": honest["val_s"] / honest["val_tokens"],
        },
        "attacks": {
            k: {"trials": v["trials"], "detected": v["detected"], "reasons": v["reasons"]}
            for k, v in {**attacks, **measured}.items()
        },
        "required_attacks": REQUIRED,
        "attack_crashes": sum(v["crashes"] for v in {**attacks, **measured}.values()),
    }
    return section, honest


def vllm_backend() -> tuple[GenerationBackend | None, str]:
    try:
        from prime_swarm.libs.model.backend import make_backend

        return make_backend("vllm", "bf16"), ""
    except Exception as exc:  # noqa: BLE001 - reported in the results
        return None, f"{type(exc).__name__}: {exc}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--honest", type=int, default=1000, help="honest rollouts per engine pair")
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--variants", type=int, default=100, help="rollouts per precision variant")
    ap.add_argument("--model", type=Path, default=None, help="base model dir (default: tiny)")
    ap.add_argument("--out", default=str(REPO / "bench/results/toploc.json"))
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--engines", default="hf,vllm", help="prover engines to run")
    args = ap.parse_args()
    engines = args.engines.split(",")
    rng = random.Random(20250601)
    torch.manual_seed(0)
    started = time.time()
    p = models(args.model)
    validator = Validator({8: p["v8"], 9: p["v9"], 10: p["v10"]})
    pairs: dict[str, dict] = {}
    hf_honest = None
    variants: dict = {}
    pipe: dict = {}
    ref: dict = {"available": False, "why": "--no-reference"}
    # hf first: its sections vary thread counts, which a started vLLM engine pins.
    if "hf" in engines:
        torch.set_num_threads(2)
        variants = {
            pr: variant_run(p, validator, pr, args.variants, rng) for pr in ("fp32", "fp16")
        }
        pairs["hf/hf"], hf_honest = engine_pair(HF, p, validator, rng, args)
        pipe = pipelined_overhead(p, rng)
        if not args.no_reference:
            ref = reference_block(hf_honest, p, rng)
    vllm_why = "not requested (--engines)"
    if "vllm" in engines:
        vllm, vllm_why = vllm_backend()
        if vllm is not None:
            pairs["vllm/hf"], _ = engine_pair(vllm, p, validator, rng, args)
    result: dict = {
        "honest": {
            s["prover_engine"]: {
                "rollouts": s["honest"]["rollouts"],
                "false_rejections": s["honest"]["false_rejections"],
            }
            for s in pairs.values()
        },
        "attacks": {
            s["prover_engine"]: {
                k: {"trials": v["trials"], "detected": v["detected"]}
                for k, v in s["attacks"].items()
                if k in REQUIRED
            }
            for s in pairs.values()
        },
        "all_required_attacks_detected": all(
            s["attacks"][k]["detected"] == s["attacks"][k]["trials"]
            for s in pairs.values()
            for k in REQUIRED
        ),
        "precision_variants": {
            k: {"rollouts": v["rollouts"], "false_rejections": v["false_rejections"]}
            for k, v in variants.items()
        },
        "engine_pairs": pairs,
        "reference": ref,
        "details": {
            "vllm": "ran" if "vllm/hf" in pairs else vllm_why,
            "forgeries_cycled": FORGERIES,
            "model": str(args.model) if args.model else TINY_DESCRIPTION,
            "cpu_threads_available": os.cpu_count(),
            "wall_s": time.time() - started,
        },
    }
    if hf_honest is not None:
        gen_spt = hf_honest["gen_s"] / hf_honest["gen_tokens"]
        result |= {
            "validate_vs_generate_cost": (hf_honest["val_s"] / hf_honest["val_tokens"]) / gen_spt,
            "proof_overhead_pct": 100 * hf_honest["prove_s"] / hf_honest["gen_s"],
            "proof_critical_path_overhead_pct": pipe["critical_path_overhead_pct"],
            "bytes_per_token": hf_honest["proof_bytes"] / hf_honest["gen_tokens"],
        }
        result["details"]["pipelined"] = pipe
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # The other TOPLOC benches' sections (models.py, multi_turn.py, cross_device.py on a lent
    # GPU) are theirs: a run of this one keeps them.
    previous = read_results(out)
    result |= {k: previous[k] for k in OTHER_SECTIONS if k in previous}
    write_results(out, result)
    summary = {k: result[k] for k in ("honest", "attacks", "all_required_attacks_detected")}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
