"""Multi-turn rollouts through the validator: honest episodes from the hf and vllm workers, and
every way of cheating a branch, each cheat on a fresh lease.

    .venv/bin/python -m bench.toploc.multi_turn [--honest 2000] [--trials 100] [--engines hf,vllm]

writes the `multi_turn` section of bench/results/toploc.json:

    {"honest": {"rollouts", "branches", "false_rejections", "engines", "turns_histogram", ...},
     "attacks": {<name>: {"trials", "detected", "reasons"}}, ...}

The model is the tiny one warm-started on the multi-turn game (`guess-number`: the model guesses,
the environment replies higher or lower), so that most branches hold several turns. Honest
groups are the worker's own path (libs/rollout/answer.start_leases: episodes played turn by
turn, one proof prefill per branch); the validator is the service's decision path in process
(admission, prompt and shape checks, verify_batch's settled decision). A cheater runs the
right model and rebuilds its proofs over whatever it submits; each attack leaves everything else
honest, so only the check meant for it stands between the cheat and an accepted rollout:

- forged_tool_output: the environment's reply after turn 0 replaced by another reply (the
  other direction), later turns sampled honestly from the forged context;
- skipped_tool_call: no reply after turn 0, the next turn sampled straight after it (with the
  right noise positions) and claimed as one turn (two adjacent turns are malformed);
- edited_earlier_turn: turn 0 replaced by another guess, the environment's replies and the
  later turns honestly derived from the edit;
- retokenized_turn: a turn's tokens replaced by the tokenization of its decoded text;
- unseeded_turn: turn 1 sampled with another seed's noise;
- proof_last_turn_only: honest tokens, the proof built over the last turn's states alone;
- cut_short: the branch ends after turn 0 although the environment replied.
"""

from __future__ import annotations

import argparse
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prime_swarm.libs.environments import load_env
from prime_swarm.libs.environments.base import Env, Task
from prime_swarm.libs.model.backend import (
    Generation,
    GenerationBackend,
    SampleRow,
    make_backend,
)
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.hardware import device_class
from prime_swarm.libs.model.io import load_pretrained
from prime_swarm.libs.model.tokenizer import decode
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.rollout import verify
from prime_swarm.libs.rollout.admission import Refusal, check_admission
from prime_swarm.libs.rollout.answer import ProofBuilder, start_leases
from prime_swarm.libs.rollout.episode import Branch, Limits, play
from prime_swarm.libs.rollout.recompute import prefill_hidden
from prime_swarm.libs.toploc import build_proofs_batch, group_contexts
from prime_swarm.libs.warmstart import warm_start
from prime_swarm.protocol.messages import (
    CompletionSample,
    Lease,
    SamplingParams,
    SubmittedRollout,
)

from .results_file import read_results, write_results

REPO = Path(__file__).resolve().parents[2]
ENV_NAME = "guess-number"
VERSION, ASYNC_LEVEL = 3, 2
GROUP, MAX_NEW, TEMPERATURE = 4, 3, 1.0
WORKER = "0x" + "ab" * 20
HERE = device_class("cpu")


def policy(cache: Path, device: str = "cpu") -> LoadedPolicy:
    """The tiny model warm-started on the game's demonstrations (built once into the cache)."""
    out = warm_start(0, cache / f"warm-{ENV_NAME}-bench", seed=0, env=ENV_NAME)
    return LoadedPolicy(VERSION, "cd" * 32, load_pretrained(out, device=device))


def new_lease(
    env: Env, rng: random.Random, n: int, max_new: int = MAX_NEW, group: int = GROUP
) -> Lease:
    task = env.task_from_id(env.task_id("train", rng.randrange(10**6)))
    return Lease(
        lease_id=f"mt-{n}",
        worker=WORKER,
        pool_id=1,
        work_id=n,
        env=env.name,
        task_id=task.task_id,
        prompt=task.prompt,
        group_size=group,
        sampling=SamplingParams(temperature=TEMPERATURE, max_new_tokens=max_new),
        seed=rng.randrange(2**62),
        min_policy_version=0,
        expires_at=time.time() + 3600,
    )


def answered(
    p: LoadedPolicy, leases: list[Lease], backend: GenerationBackend
) -> list[SubmittedRollout]:
    """The worker's path: episodes played, proved off the critical path, submitted."""
    builder = ProofBuilder()
    try:
        pending = start_leases(p, leases, backend, builder)
        return [
            SubmittedRollout(
                submission_id=f"s-{x.lease.lease_id}", lease=x.lease, submission=x.result()
            )
            for x in pending
        ]
    finally:
        builder.close()


@dataclass
class Replays:
    """The largest replay gap and z the validator measured on groups it judged."""

    gap: float = 0.0
    z: float = 0.0
    rechecked: int = 0
    """Groups that were suspects and went to the second opinion (whatever it said)."""

    def add(self, judgement: verify.Judgement) -> None:
        self.rechecked += judgement.rechecked
        if judgement.evidence is not None:
            self.gap = max(self.gap, judgement.evidence.max_replay_gap)
            self.z = max(self.z, judgement.evidence.max_replay_z)


def validate(
    entries: list[SubmittedRollout], p: LoadedPolicy, replays: Replays | None = None
) -> list[str]:
    """The validator service's decision for each entry: "accepted" or the refusal's reason."""
    out = [""] * len(entries)
    works, at = [], []
    for i, e in enumerate(entries):
        try:
            check_admission(e.submission, e.lease, VERSION, ASYNC_LEVEL)
            verify.check_prompt(e, p.lm)
            verify.check_shapes(e, p.lm)
        except Refusal as rej:
            out[i] = rej.reason
            continue
        works.append(verify.Work(e, p))
        at.append(i)
    for i, d in zip(at, verify.verify_batch(works, 1e-6, device_class=HERE), strict=True):
        if replays is not None:
            replays.add(d.judgement)
        # Held: a suspect from another device class, left for a validator of it.
        out[i] = "accepted" if d.refusal is None else d.refusal.reason
    return out


# --------------------------------------------------------------------------- cheating
@dataclass
class Cheat:
    """One branch as a cheater submits it; `proof_over` picks the positions its proof covers
    (default: every token after the prompt, as an honest proof)."""

    token_ids: list[int]
    spans: list[list[int]]
    finish_reason: str
    proof_over: slice | None = None


def turns_of(c: CompletionSample) -> list[list[int]]:
    return [c.token_ids[a:b] for a, b in c.sampled_spans]


class Scripted:
    """A backend that samples honestly except where `override(row)` returns the tokens to use."""

    name = "hf"
    precision = "bf16"

    def __init__(
        self, inner: GenerationBackend, override: Callable[[SampleRow], Generation | None]
    ) -> None:
        self.inner, self.override = inner, override

    def generate_rows(
        self, lm: CausalLM, rows: Sequence[SampleRow], *, max_new_tokens: int, temperature: float
    ) -> list[Generation]:
        honest = self.inner.generate_rows(
            lm, rows, max_new_tokens=max_new_tokens, temperature=temperature
        )
        return [self.override(r) or g for r, g in zip(rows, honest, strict=True)]


class Forging(Env):
    """The game with one reply replaced: what a worker that forges a tool's output plays."""

    def __init__(self, env: Env, at_turn: int, forged: Callable[[str], str]) -> None:
        self.env, self.at_turn, self.forged = env, at_turn, forged
        self.name, self.max_answer_chars, self.max_turns = (
            env.name,
            env.max_answer_chars,
            env.max_turns,
        )

    def task_from_id(self, task_id: str) -> Task:
        return self.env.task_from_id(task_id)

    def reward(self, task: Task, completion: str) -> float:
        return self.env.reward(task, completion)

    def reply(self, task: Task, turns: Sequence[str]) -> str | None:
        honest = self.env.reply(task, turns)
        return (
            self.forged(honest) if honest is not None and len(turns) == self.at_turn + 1 else honest
        )

    def score(self, task: Task, turns: Sequence[str]) -> float:
        return self.env.score(task, turns)

    def noisy_answer(self, task: Task, rng: random.Random, error_rate: float) -> str:
        return self.env.noisy_answer(task, rng, error_rate)


def replayed(
    p: LoadedPolicy, e: SubmittedRollout, i: int, env: Env, backend: GenerationBackend
) -> Cheat:
    """Branch i played again from scratch with `env` and `backend` (seed and sample as leased),
    beside the group's other branches: bf16 rounds by batch shape, so its first turn is the
    one the worker sampled when the group was answered alone."""
    lease, sub = e.lease, e.submission
    task = env.task_from_id(lease.task_id)
    prompt = sub.prompt_token_ids
    new, temperature = lease.sampling.max_new_tokens, lease.sampling.temperature
    limits = Limits.of(p.lm, len(prompt), new)
    group = [Branch(env, task, prompt, lease.seed, j, limits) for j in range(len(sub.completions))]
    play(backend, p.lm, group, max_new_tokens=new, temperature=temperature)
    b = group[i]
    return Cheat(b.token_ids, b.spans, b.finish_reason)


def forged_tool_output(
    p: LoadedPolicy, e: SubmittedRollout, i: int, hf: GenerationBackend
) -> Cheat | None:
    cheat = replayed(p, e, i, Forging(load_env(e.lease.env), 0, forged_reply), hf)
    # A replay whose turn 0 is not the worker's (bf16 rounds by batch shape, and the worker
    # may have answered the group beside others) called no tool: nothing forged, void.
    first = turns_of(e.submission.completions[i])[0]
    a, b = cheat.spans[0]
    return cheat if len(cheat.spans) > 1 and cheat.token_ids[a:b] == first else None


def forged_reply(reply: str) -> str:
    """Another reply than the environment's: the game's other direction, a tool output's first
    digit changed (a forged computation), else the reply with a character added."""
    flip = {"+": "-", "-": "+"}
    if reply in flip:
        return flip[reply]
    digit = re.search(r"\d", reply)
    if digit is None:
        return reply + "!"
    at = digit.start()
    return reply[:at] + str((int(reply[at]) + 1) % 10) + reply[at + 1 :]


def skipped_tool_call(
    p: LoadedPolicy, e: SubmittedRollout, i: int, hf: GenerationBackend
) -> Cheat | None:
    c = e.submission.completions[i]
    first = turns_of(c)[0]
    # The next turn sampled straight after turn 0, at the positions it would take there.
    row = SampleRow([*e.submission.prompt_token_ids, *first], e.lease.seed, i, len(first))
    (g,) = hf.generate_rows(
        p.lm,
        [row],
        max_new_tokens=e.lease.sampling.max_new_tokens,
        temperature=e.lease.sampling.temperature,
    )
    tokens = first + g.token_ids
    return Cheat(tokens, [[0, len(tokens)]], g.finish_reason)


def edited_earlier_turn(
    p: LoadedPolicy, e: SubmittedRollout, i: int, hf: GenerationBackend
) -> Cheat | None:
    tok = p.lm.tokenizer
    first = turns_of(e.submission.completions[i])[0]
    text = decode(tok, first)
    other = str((int(text) + 3) % 10) if text.isdigit() else "5"
    edit = [*tok(other, add_special_tokens=False)["input_ids"], min(p.lm.eos_ids)]

    def override(row: SampleRow) -> Generation | None:
        return Generation(edit, "eos", [0.0] * len(edit)) if row.offset == 0 else None

    return replayed(p, e, i, load_env(e.lease.env), Scripted(hf, override))


def retokenized_turn(
    p: LoadedPolicy, e: SubmittedRollout, i: int, hf: GenerationBackend
) -> Cheat | None:
    c = e.submission.completions[i]
    tok = p.lm.tokenizer
    for k, (a, b) in enumerate(c.sampled_spans):
        again = list(tok(decode(tok, c.token_ids[a:b]), add_special_tokens=False)["input_ids"])
        if again and again != c.token_ids[a:b]:
            shift = len(again) - (b - a)
            tokens = c.token_ids[:a] + again + c.token_ids[b:]
            spans = [
                s if j < k else ([a, b + shift] if j == k else [s[0] + shift, s[1] + shift])
                for j, s in enumerate(c.sampled_spans)
            ]
            return Cheat(tokens, spans, c.finish_reason)
    return None  # every turn re-tokenizes to itself: nothing to cheat with here


def unseeded_turn(
    p: LoadedPolicy, e: SubmittedRollout, i: int, hf: GenerationBackend
) -> Cheat | None:
    def override(row: SampleRow) -> Generation | None:
        if row.offset == 0 or row.seed != e.lease.seed:
            return None
        other = SampleRow(row.context, row.seed ^ 0x5EED, row.sample, row.offset)
        sampling = e.lease.sampling
        return hf.generate_rows(
            p.lm, [other], max_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature
        )[0]

    cheat = replayed(p, e, i, load_env(e.lease.env), Scripted(hf, override))
    honest = e.submission.completions[i]
    return None if cheat.token_ids == honest.token_ids else cheat


def proof_last_turn_only(
    p: LoadedPolicy, e: SubmittedRollout, i: int, hf: GenerationBackend
) -> Cheat | None:
    c = e.submission.completions[i]
    a, b = c.sampled_spans[-1]
    return Cheat(
        list(c.token_ids), [list(s) for s in c.sampled_spans], c.finish_reason, slice(a, b)
    )


def cut_short(p: LoadedPolicy, e: SubmittedRollout, i: int, hf: GenerationBackend) -> Cheat | None:
    c = e.submission.completions[i]
    a, b = c.sampled_spans[0]
    turn = c.token_ids[a:b]
    return Cheat(turn, [[0, b]], "eos" if turn[-1] in p.lm.eos_ids else "length")


ATTACKS: dict[str, Callable[..., Cheat | None]] = {
    f.__name__: f
    for f in (
        forged_tool_output,
        skipped_tool_call,
        edited_earlier_turn,
        retokenized_turn,
        unseeded_turn,
        proof_last_turn_only,
        cut_short,
    )
}


def submitted(p: LoadedPolicy, e: SubmittedRollout, i: int, cheat: Cheat) -> SubmittedRollout:
    """Branch i replaced by the cheat, with a proof rebuilt over what the cheat claims."""
    sub = e.submission
    prompt = sub.prompt_token_ids
    comps = [c.token_ids for c in sub.completions]
    comps[i] = cheat.token_ids
    ctx = group_contexts(p.model_hash, e.lease.lease_id, comps)[i]
    over = cheat.proof_over or slice(0, len(cheat.token_ids))
    # The proof prefill over the covered positions alone: the prefix is its context.
    (hidden,) = prefill_hidden(
        p.lm, [([*prompt, *cheat.token_ids[: over.start]], cheat.token_ids[over])], sub.precision
    )
    (proof,) = build_proofs_batch([hidden], [ctx])
    env = load_env(e.lease.env)
    task = env.task_from_id(e.lease.task_id)
    turns = [decode(p.lm.tokenizer, cheat.token_ids[a:b]) for a, b in cheat.spans]
    sample = CompletionSample.model_validate(
        {
            "token_ids": cheat.token_ids,
            "sampled_spans": cheat.spans,
            "finish_reason": cheat.finish_reason,
            "proof": proof,
            "claimed_reward": env.score(task, turns),
        }
    )
    completions = list(sub.completions)
    completions[i] = sample
    return e.model_copy(update={"submission": sub.model_copy(update={"completions": completions})})


def run_attack(
    name: str,
    p: LoadedPolicy,
    hf: GenerationBackend,
    env: Env,
    rng: random.Random,
    trials: int,
    serial: list[int],
) -> dict:
    reasons: Counter[str] = Counter()
    missed: list[dict[str, float]] = []
    detected = 0
    done = 0
    while done < trials:
        serial[0] += 1
        (e,) = answered(p, [new_lease(env, rng, serial[0])], hf)
        # A branch of several turns, so that there is a reply to forge, skip or cut.
        multi = [i for i, c in enumerate(e.submission.completions) if len(c.sampled_spans) > 1]
        # The first such branch the attack applies to (a resampled turn may equal the honest one).
        found = ((i, ATTACKS[name](p, e, i, hf)) for i in multi)
        i, cheat = next(((i, c) for i, c in found if c is not None), (-1, None))
        if cheat is None:
            continue
        done += 1
        try:
            verdict = validate([submitted(p, e, i, cheat)], p, passed := Replays())[0]
            if verdict == "accepted":
                missed.append(
                    {"max_replay_gap": round(passed.gap, 4), "max_replay_z": round(passed.z, 2)}
                )
        except ValueError as exc:  # the wire format refuses it: a 422 at intake
            verdict = f"malformed (schema: {str(exc).splitlines()[0][:60]})"
        detected += verdict != "accepted"
        reasons[verdict] += 1
    out: dict = {"trials": trials, "detected": detected, "reasons": dict(reasons)}
    if missed:
        out["missed"] = missed  # what the replay measured on the cheats it let through
    return out


def honest_run(
    p: LoadedPolicy,
    backend: GenerationBackend,
    env: Env,
    rng: random.Random,
    groups: int,
    serial: list[int],
    batch: int = 16,
) -> dict:
    verdicts: Counter[str] = Counter()
    turns: Counter[int] = Counter()
    replays = Replays()
    t0 = time.perf_counter()
    for start in range(0, groups, batch):
        leases = []
        for _ in range(min(batch, groups - start)):
            serial[0] += 1
            leases.append(new_lease(env, rng, serial[0]))
        entries = answered(p, leases, backend)
        verdicts.update(validate(entries, p, replays))
        turns.update(len(c.sampled_spans) for e in entries for c in e.submission.completions)
    return {
        "rollouts": groups,
        "branches": groups * GROUP,
        "false_rejections": groups - verdicts["accepted"],
        "verdicts": dict(verdicts),
        "turns_histogram": {str(k): v for k, v in sorted(turns.items())},
        "multi_turn_branches": sum(v for k, v in turns.items() if k > 1),
        # The honest side of the replay's margins (limits: libs/rollout/calibration.py).
        "max_replay_gap": round(replays.gap, 4),
        "max_replay_z": round(replays.z, 2),
        "rechecked": replays.rechecked,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def worker_only(args: argparse.Namespace) -> None:
    """Honest groups generated on `--device` (a GPU here: the other device class), saved."""
    p = policy(args.cache, args.device)
    env = load_env(ENV_NAME)
    rng = random.Random(args.device)
    backend = make_backend("hf", "bf16")
    t0 = time.perf_counter()
    with args.worker_only.open("w") as f:
        for start in range(0, args.honest, 16):
            leases = [new_lease(env, rng, start + k) for k in range(min(16, args.honest - start))]
            for e in answered(p, leases, backend):
                f.write(e.model_dump_json() + "\n")
    print(f"{args.honest} groups on {args.device} in {time.perf_counter() - t0:.1f} s")


def validate_file(args: argparse.Namespace) -> None:
    """The validator's half: judge saved groups here, on this machine's device class."""
    p = policy(args.cache)
    lines = args.validate.read_text().splitlines()
    entries = [SubmittedRollout.model_validate_json(line) for line in lines]
    replays = Replays()
    verdicts: Counter[str] = Counter()
    for start in range(0, len(entries), 16):
        verdicts.update(validate(entries[start : start + 16], p, replays))
    turns = Counter(len(c.sampled_spans) for e in entries for c in e.submission.completions)
    section = {
        "worker_device_class": sorted({e.submission.device_class for e in entries}),
        "validator_device_class": HERE,
        "rollouts": len(entries),
        "branches": sum(turns.values()),
        "multi_turn_branches": sum(v for k, v in turns.items() if k > 1),
        "verdicts": dict(verdicts),
        "false_rejections": len(entries) - verdicts["accepted"] - verdicts["held_for_recheck"],
        "max_replay_gap": round(replays.gap, 4),
        "max_replay_z": round(replays.z, 2),
        "rechecked": replays.rechecked,
    }
    doc = read_results(args.out)
    doc.setdefault("multi_turn", {})["cross_device"] = section
    write_results(args.out, doc)
    print(section)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--honest",
        type=int,
        default=2000,
        help="honest groups (rollouts) in all, split over the engines",
    )
    ap.add_argument("--trials", type=int, default=100, help="cheated rollouts per attack")
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--cache", type=Path, default=REPO / ".cache" / "models")
    ap.add_argument("--out", type=Path, default=REPO / "bench/results/toploc.json")
    ap.add_argument(
        "--worker-only",
        type=Path,
        help="generate --honest groups with the hf worker on --device and write them to this "
        "JSON-lines file, judging nothing (the worker's half of a cross-device check)",
    )
    ap.add_argument("--device", default="cpu", help="the --worker-only worker's device")
    ap.add_argument(
        "--validate",
        type=Path,
        help="judge the groups of a --worker-only file here and write multi_turn.cross_device",
    )
    args = ap.parse_args()
    if args.worker_only:
        return worker_only(args)
    if args.validate:
        return validate_file(args)
    p = policy(args.cache)
    env = load_env(ENV_NAME)
    rng = random.Random(2026)
    serial = [0]
    hf = make_backend("hf", "bf16")
    attacks = {}
    for name in ATTACKS:
        attacks[name] = run_attack(name, p, hf, env, rng, args.trials, serial)
        print(name, attacks[name], flush=True)
    engines = [e for e in args.engines.split(",") if e]
    per_engine = {}
    for k, name in enumerate(engines):
        share = args.honest // len(engines) + (k < args.honest % len(engines))
        per_engine[name] = honest_run(p, make_backend(name, "bf16"), env, rng, share, serial)
        print(name, per_engine[name], flush=True)
    section = {
        "honest": {
            "rollouts": sum(r["rollouts"] for r in per_engine.values()),
            "branches": sum(r["branches"] for r in per_engine.values()),
            "multi_turn_branches": sum(r["multi_turn_branches"] for r in per_engine.values()),
            "false_rejections": sum(r["false_rejections"] for r in per_engine.values()),
            "engines": per_engine,
        },
        "attacks": attacks,
        "all_attacks_detected": all(a["detected"] == a["trials"] for a in attacks.values()),
        "config": {
            "model": f"tiny, warm-started on {ENV_NAME}",
            "env": ENV_NAME,
            "group_size": GROUP,
            "max_new_tokens_per_turn": MAX_NEW,
            "temperature": TEMPERATURE,
            "precision": "bf16",
            "device_class": HERE,
        },
    }
    doc = read_results(args.out)
    if "cross_device" in doc.get("multi_turn", {}):  # a --validate run's, kept
        section["cross_device"] = doc["multi_turn"]["cross_device"]
    doc["multi_turn"] = section
    write_results(args.out, doc)
    print(f"wrote multi_turn to {args.out}")


if __name__ == "__main__":
    main()
