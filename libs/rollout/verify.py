"""The validator's checks: what a submission must show, each failure with a named reason.

`verify_batch` is the whole decision for a batch of submissions: one recomputation per policy
version and precision (libs/rollout/recompute.py), one TOPLOC check for every proof, then per
group `measure_group` (the evidence: proof statistics against the fp32 reference, the weight
ratio, replay gaps, rewards, log-probs) and `judge_group` (the evidence against the calibrated
bands: accept, suspect or reject). A suspect gets a second opinion (`second_opinion`: the
validator's recomputation in the declared precision and a KV-cached decode, the worker's own
path) before anything is slashed: no honest worker is slashed on one opinion (DESIGN.md §3.10).
Nor for its environment's bug: a group refused on the environment's tokens or score gets a
second look at the environment (`environment_second_look`), and is held if it disagrees with
itself.
`decide` settles it: each group leaves as a `Decision` (accept, hold or reject, with its reason)
that the validator service only encodes and commits. Measuring and judging are split so that
the benchmark reports the very numbers the validator decides on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from prime_swarm.libs.environments import load_env
from prime_swarm.libs.environments.determinism import Episode, second_look
from prime_swarm.libs.environments.reward import LengthReward, RewardParts, score
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.logprobs import token_logprobs
from prime_swarm.libs.model.noise import gumbel_rows, perturbed_scores
from prime_swarm.libs.model.tokenizer import decode, prompt_ids
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.toploc import (
    ProofContext,
    VerifyResult,
    compare_hidden,
    group_contexts,
    pooled_chunk_err,
    pooled_mant_err_mean,
    verify_proofs_batch,
)
from prime_swarm.protocol.messages import (
    RolloutSubmission,
    SubmittedRollout,
    VerifiedCompletion,
    sampled_mask,
)

from .admission import Refusal
from .calibration import Acceptance, acceptance_for
from .episode import Limits, replay_turns
from .recompute import Recomputed, decode_logits, recompute

# Which refusals slash: every one but these. Staleness at validation time can be the queue's
# fault, not the worker's; held work awaits a second opinion, or the operator's fix of an
# environment that disagrees with itself: refused for now, never slashed. A duplicate is refused
# (the pool has that group already) but not slashed: where prompts recur (a finite train set,
# live selection) a confident policy's honest group can equal another lease's token for token at
# the same version (seen in the e2e run at 8 threads), and a copier earns nothing from the
# refusal either. The validator's own failure on a group is its own fault (bench-stacks found
# torch 2.13's bf16 attention refusing a validator capped to AVX2 kernels on an AMX CPU:
# "pack_vnni2 is only supported when avx512 is supported").
NOT_SLASHED: frozenset[str] = frozenset(
    {
        "stale_policy",
        "held_for_recheck",
        "env_nondeterministic",
        "env_unsettled",
        "duplicate",
        "validator_error",
    }
)


# --------------------------------------------------------------------------- recomputation
@dataclass
class Replay:
    """The seeded sampling replayed against some logits, at every position."""

    gaps: torch.Tensor
    """Best perturbed score minus the submitted token's (0 when the submitted token is the
    seeded choice); in tempered-logit units."""
    seeded: torch.Tensor
    """The token the seeded noise chooses under these logits."""


def replay_gaps(
    logits: torch.Tensor, token_ids: Sequence[int], temperature: float, seed: int, sample: int
) -> torch.Tensor:
    """Per position of one completion: how far the submitted token trails the seeded choice.

    An honest token's gap is 0 up to near-ties that decode and prefill noise can flip; a token
    the seeded noise did not choose trails by O(1).
    """
    tokens = torch.as_tensor(list(token_ids), dtype=torch.long, device=logits.device)
    return replay(logits, tokens, temperature, [(seed, sample, k) for k in range(len(tokens))]).gaps


def replay(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float,
    rows: Sequence[tuple[int, int, int]],
) -> Replay:
    """The replay of positions of any completions at once: logits [N, V], tokens [N], and each
    position's noise row (seed, sample, position)."""
    if temperature > 0:
        scores = perturbed_scores(
            logits, temperature, gumbel_rows(list(rows), logits.shape[-1], logits.device)
        )
    else:
        scores = logits.float()
    best = scores.max(dim=-1)
    return Replay(best.values - scores.gather(-1, tokens[:, None]).squeeze(-1), best.indices)


def replay_z(
    lm: CausalLM,
    played: Replay,
    tokens: torch.Tensor,
    noise: torch.Tensor,
    temperature: float,
    floor: float,
) -> torch.Tensor:
    """Each position's gap in units of the honest noise on it (0 where there is no gap).

    A hidden-state rounding error d moves the seeded choice a's score against the submitted
    token b's by (w_a - w_b) . d / T (w: LM head rows); for an error of norm |d| in no particular
    direction that is about |w_a - w_b| |d| / sqrt(C). `noise` is |d| at each position, from
    the validator's own recomputation in the declared precision. An honest flip is a near-tie
    inside that noise (z of a few); a token the seeded noise did not choose trails by tens to
    thousands of it even where its gap is small in logits (bench/results/toploc.json)."""
    w = lm.head_weight()
    spread = (w[played.seeded] - w[tokens]).norm(dim=-1)
    scale = spread * noise.to(spread.device) / w.shape[1] ** 0.5
    z = played.gaps / (scale / (temperature if temperature > 0 else 1.0)).clamp_min(floor)
    return torch.where(played.gaps > 0, z, torch.zeros_like(z))


def hidden_noise(recs: Sequence[Recomputed]) -> torch.Tensor:
    """[N] the norm of the validator's declared-precision error at each position of a group,
    raised to the group's RMS: a position whose own rounding happened to be small says little
    about the worker's."""
    per = torch.cat([(r.declared.float() - r.reference).norm(dim=-1) for r in recs])
    return per.clamp_min(float(per.pow(2).mean().sqrt()))


def sampled_positions(sub: RolloutSubmission) -> torch.Tensor:
    """[N] over the group's completion positions in order: True where the model sampled the
    token. Only those are replayed against the seeded noise; the rest are the environment's
    (tool output, replies, chat-template tokens), checked exactly by `replay_turns`."""
    return torch.tensor(
        [m for c in sub.completions for m in sampled_mask(c.sampled_spans, len(c.token_ids))],
        dtype=torch.bool,
    )


# --------------------------------------------------------------------------- cheap checks
def check_prompt(entry: SubmittedRollout, lm: CausalLM) -> None:
    if entry.submission.prompt_token_ids != prompt_ids(lm.tokenizer, entry.lease.prompt):
        raise Refusal("lease_mismatch", "prompt tokens differ from the leased prompt")


def check_shapes(entry: SubmittedRollout, lm: CausalLM) -> None:
    """Token ids the model can embed and sequences it can hold: a submission must never be able
    to crash the batched prefill it shares with other workers' submissions."""
    prompt = entry.submission.prompt_token_ids
    for i, c in enumerate(entry.submission.completions):
        if not c.token_ids or min(c.token_ids) < 0 or max(c.token_ids) >= lm.vocab_size:
            raise Refusal("malformed", f"completion {i} has token ids outside the vocabulary")
        if len(prompt) + len(c.token_ids) > lm.context_len:
            raise Refusal("malformed", f"completion {i} overflows the model's context")


# --------------------------------------------------------------------------- evidence
@dataclass
class Work:
    """One submission and the policy it claims, as the validator judges it."""

    entry: SubmittedRollout
    policy: LoadedPolicy

    def pairs(self) -> list[tuple[list[int], list[int]]]:
        sub = self.entry.submission
        return [(sub.prompt_token_ids, c.token_ids) for c in sub.completions]


def check_proofs(
    works: Sequence[Work], recomputed: Sequence[Sequence[Recomputed]], acceptance: Acceptance
) -> list[list[VerifyResult]]:
    """The TOPLOC check of many groups' proofs in one batch (its field arithmetic costs per
    call, not per chunk), each against the fp32 reference of that group, with the gross limits
    only (the weight ratio judges the rest)."""
    flat_h: list[torch.Tensor] = []
    flat_p: list[bytes] = []
    flat_c: list[ProofContext] = []
    for work, recs in zip(works, recomputed, strict=True):
        sub, lease = work.entry.submission, work.entry.lease
        flat_h.extend(r.reference for r in recs)
        flat_p.extend(c.proof for c in sub.completions)
        flat_c.extend(
            group_contexts(
                work.policy.model_hash, lease.lease_id, [c.token_ids for c in sub.completions]
            )
        )
    results = verify_proofs_batch(flat_h, flat_p, flat_c, acceptance.gross)
    out, at = [], 0
    for recs in recomputed:
        out.append(results[at : at + len(recs)])
        at += len(recs)
    return out


@dataclass
class CompletionEvidence:
    proof: VerifyResult
    max_replay_gap: float
    max_replay_z: float
    """The largest gap in units of the honest noise at its position (`replay_z`)."""
    first_bad_position: int | None
    """The first sampled token whose replay is a reject (None: none is)."""
    reward: RewardParts
    logprobs: list[float]
    episode: Refusal | None = None
    """Why the environment, run again on the claimed turns, disagrees with the branch (None:
    every token the model did not sample is the environment's and the episode ends where the
    branch does)."""


@dataclass
class GroupEvidence:
    completions: list[CompletionEvidence]
    worker_err: float
    """Pooled mantissa error (ulps) of the worker's proofs against the fp32 reference."""
    noise_err: float
    """The same for the validator's own recomputation in the declared precision: this model's
    honest noise at this depth, on these tokens."""
    weight_ratio: float
    """worker_err / max(noise_err, floor): about 1 for honest work, whatever the depth."""
    same_class_err: float | None = None
    """Pooled error of the proofs against the validator's own declared-precision recomputation,
    measured only when the worker declared the validator's device class: there honest work
    agrees bit for bit (libs/rollout/recompute.prefill_hidden), so weights a few
    roundings away (int8 on a 2-layer model) stand out where the fp32 ratio cannot see them."""

    @property
    def max_replay_gap(self) -> float:
        return max(ev.max_replay_gap for ev in self.completions)

    @property
    def max_replay_z(self) -> float:
        return max(ev.max_replay_z for ev in self.completions)


@torch.no_grad()
def measure_group(
    work: Work,
    recs: Sequence[Recomputed],
    acceptance: Acceptance,
    length: LengthReward | None = None,
    proofs: Sequence[VerifyResult] | None = None,
    same_class: bool = False,
) -> GroupEvidence:
    """Recompute everything the verdict rests on from the validator's recomputation.
    `proofs`: the group's proofs already checked (`check_proofs`, batched over many groups);
    `same_class`: the worker declared the validator's device class."""
    length = length or LengthReward()
    entry, policy = work.entry, work.policy
    sub, lease = entry.submission, entry.lease
    lm = policy.lm.cast("fp32")
    env = load_env(lease.env, lease.env_args)
    task = env.task_from_id(lease.task_id)
    if proofs is None:
        proofs = check_proofs([work], [recs], acceptance)[0]
    temperature = lease.sampling.temperature
    # The whole group's positions in one head, one noise gather and one softmax: per-completion
    # calls cost more in dispatch than in arithmetic at these sizes.
    lengths = [len(c.token_ids) for c in sub.completions]
    tokens = torch.as_tensor(
        [t for c in sub.completions for t in c.token_ids], dtype=torch.long, device=lm.device
    )
    logits = lm.head_logits(torch.cat([r.reference for r in recs]).to(lm.device))
    # The noise of completion position k is keyed (seed, sample, k) whether the model or the
    # environment wrote the tokens before it; only the model's positions are judged.
    rows = [(lease.seed, i, k) for i, n in enumerate(lengths) for k in range(n)]
    sampled = sampled_positions(sub)
    played = replay(logits, tokens, temperature, rows)
    zs = replay_z(
        lm, played, tokens, hidden_noise(recs), temperature, acceptance.replay_noise_floor
    ).cpu()
    gaps = played.gaps.cpu().where(sampled, torch.zeros(()))
    zs = zs.where(sampled, torch.zeros(()))
    logprobs = token_logprobs(logits, tokens, temperature).cpu()
    bad = (gaps >= acceptance.max_replay_gap) | (zs >= acceptance.replay_z.reject_from)
    prompt_len = len(sub.prompt_token_ids)
    limits = Limits.of(lm, prompt_len, lease.sampling.max_new_tokens)
    out = []
    at = 0
    for c, proof, n in zip(sub.completions, proofs, lengths, strict=True):
        mine = slice(at, at + n)
        at += n
        bad_at = torch.nonzero(bad[mine])
        try:
            turns = replay_turns(env, task, lm.tokenizer, lm.eos_ids, c, limits)
            episode = None
        except Refusal as why:
            turns, episode = [decode(lm.tokenizer, c.token_ids)], why
        out.append(
            CompletionEvidence(
                proof=proof,
                max_replay_gap=float(gaps[mine].max()),
                max_replay_z=float(zs[mine].max()),
                first_bad_position=int(bad_at[0, 0]) if len(bad_at) else None,
                # The length part counts what the model wrote, not the environment's replies.
                reward=score(
                    env.score(task, turns),
                    sum(end - start for start, end in c.sampled_spans),
                    lease.target_tokens,
                    length,
                    env.format_score(task, turns) if lease.format_reward else None,
                    lease.format_reward,
                ),
                logprobs=logprobs[mine].tolist(),
                episode=episode,
            )
        )
    worker_err = pooled_mant_err_mean(list(proofs))
    noise_err = pooled_chunk_err(st for r in recs for st in compare_hidden(r.reference, r.declared))
    return GroupEvidence(
        completions=out,
        worker_err=worker_err,
        noise_err=noise_err,
        weight_ratio=worker_err / max(noise_err, acceptance.noise_floor_ulp),
        same_class_err=declared_err(work, recs, acceptance) if same_class else None,
    )


def declared_err(work: Work, recs: Sequence[Recomputed], acceptance: Acceptance) -> float:
    """Pooled error of the group's proofs against the validator's recomputation in the declared
    precision (bit for bit equal for honest work on the worker's device class)."""
    sub, lease = work.entry.submission, work.entry.lease
    contexts = group_contexts(
        work.policy.model_hash, lease.lease_id, [c.token_ids for c in sub.completions]
    )
    proofs = verify_proofs_batch(
        [r.declared for r in recs], [c.proof for c in sub.completions], contexts, acceptance.gross
    )
    return pooled_mant_err_mean(proofs)


Outcome = Literal["accept", "suspect", "reject"]


@dataclass
class Judgement:
    """What the evidence says about one group. `refusal` is why it is rejected, or for a
    suspect why it would be; `completions` is what the trainer gets if it is accepted."""

    outcome: Outcome
    evidence: GroupEvidence | None = None
    refusal: Refusal | None = None
    completions: list[VerifiedCompletion] = field(default_factory=list)
    second_opinion: Refusal | None = None
    """For a suspect that was rechecked and failed: why."""
    rechecked: bool = False
    environment: str | None = None
    """For a group refused on what its environment says (`ENVIRONMENT_REASONS`): how the
    environment, replayed again, disagreed with itself (`environment_second_look`); then the
    refusal is the environment's bug, not the worker's, and the group is held."""


def judge_group(
    work: Work, evidence: GroupEvidence, acceptance: Acceptance, reward_tolerance: float
) -> Judgement:
    """Exact checks first (the episode's environment tokens and termination, a gross proof
    failure, reward: rejected outright), then
    the noisy statistics against their bands: the weight ratio, the replay's z (an absolute
    replay gap from `max_replay_gap` rejects outright) and, where the worker declared this
    validator's class, the same-class error."""
    sub = work.entry.submission
    for i, ev in enumerate(evidence.completions):
        if ev.episode is not None:
            return _rejected(evidence, ev.episode.reason, f"completion {i}: {ev.episode.detail}")
    mantissa_why: Refusal | None = None
    for i, ev in enumerate(evidence.completions):
        if ev.proof.ok:
            continue
        chunks = ev.proof.chunks
        if not chunks or any(st.structural_failure(acceptance.gross) for st in chunks):
            return _rejected(evidence, "bad_proof", f"completion {i}: {ev.proof.reason}")
        # Exponents and signs agree, only the per-chunk mantissa error is over: one chunk of a
        # short completion is noisy (an honest 1-token completion of the 2-layer tiny model,
        # whose 128 hidden dimensions are all top-k points, near-zero ones included, reached
        # 10.47 against the limit 10). A suspect for the second opinion, never a slash.
        mantissa_why = mantissa_why or Refusal("bad_proof", f"completion {i}: {ev.proof.reason}")
    out: list[VerifiedCompletion] = []
    for i, (c, ev) in enumerate(zip(sub.completions, evidence.completions, strict=True)):
        # The worker claims the task score only: the length part needs no pool settings.
        claimed, task = c.claimed_reward, ev.reward.task
        if claimed is not None and abs(claimed - task) > reward_tolerance:
            return _rejected(
                evidence, "reward_mismatch", f"completion {i} claims {claimed}, scores {task}"
            )
        out.append(
            VerifiedCompletion(
                token_ids=c.token_ids,
                sampled_spans=c.sampled_spans,
                logprobs=ev.logprobs,
                inference_logprobs=c.logprobs,
                reward=ev.reward.total,
                task_reward=task,
                length_reward=ev.reward.length,
                format_reward=ev.reward.format,
            )
        )
    ratio = evidence.weight_ratio
    weights = acceptance.weight_ratio.outcome(ratio)
    if weights == "reject" and evidence.same_class_err is None:
        # The ratio's honest spread depends on the worker's device class; from a class other
        # than the validator's it is one noisy opinion (the 2-layer model's emulated-GPU work
        # reached 2.73), so it makes a suspect for that class to settle, never a slash.
        weights = "suspect"
    weights_why = Refusal(
        "bad_proof",
        f"weight ratio {ratio:.3f} (proof error {evidence.worker_err:.3f} ulp against the fp32 "
        f"reference, honest {sub.precision} noise {evidence.noise_err:.3f}); accepted up to "
        f"{acceptance.weight_ratio.accept_at_most}, rejected from "
        f"{acceptance.weight_ratio.reject_from}: not the claimed weights",
    )
    worst = max(evidence.completions, key=lambda ev: (ev.max_replay_z, ev.max_replay_gap))
    at = evidence.completions.index(worst)
    gap, z = evidence.max_replay_gap, evidence.max_replay_z
    own_class = evidence.same_class_err is not None
    band = (acceptance.replay_z_own_class if own_class else None) or acceptance.replay_z
    sampling = band.outcome(z)
    if sampling == "reject" and not own_class:
        # The noise scale is the validator's own rounding; another class's decode may round
        # otherwise (the emulated GPU reached 15 where this CPU reached 6): a suspect, as above.
        sampling = "suspect"
    if gap >= acceptance.max_replay_gap:
        sampling = "reject"
    sampling_why = Refusal(
        "sampling_mismatch",
        f"completion {at}: its tokens trail the seeded choice by up to "
        f"{worst.max_replay_gap:.3f}, up to {worst.max_replay_z:.1f} times the honest noise at "
        f"their position (accepted up to "
        f"{band.accept_at_most}, rejected from {band.reject_from}; any gap from "
        f"{acceptance.max_replay_gap} is rejected"
        + (
            f"; first at token {worst.first_bad_position})"
            if worst.first_bad_position is not None
            else ")"
        ),
    )
    for outcome in ("reject", "suspect"):
        if weights == outcome:
            return Judgement(outcome, evidence, weights_why, out)
        if sampling == outcome:
            return Judgement(outcome, evidence, sampling_why, out)
    if mantissa_why is not None:
        return Judgement("suspect", evidence, mantissa_why, out)
    same = evidence.same_class_err
    if same is not None and not same <= acceptance.recheck.max_group_mant_err:
        # One noisy opinion never slashes: the second opinion recomputes it the worker's way.
        why = Refusal(
            "bad_proof",
            f"proof error {same:.3f} ulp against this validator's {sub.precision} "
            f"recomputation on the worker's own device class > "
            f"{acceptance.recheck.max_group_mant_err}",
        )
        return Judgement("suspect", evidence, why, out)
    return Judgement("accept", evidence, None, out)


def _rejected(evidence: GroupEvidence, reason: str, detail: str) -> Judgement:
    return Judgement("reject", evidence, Refusal(reason, detail))  # type: ignore[arg-type]


@torch.no_grad()
def second_opinion(
    work: Work, recs: Sequence[Recomputed], acceptance: Acceptance
) -> Refusal | None:
    """The recheck of a suspect, the way the worker declared it computed: its proofs against the
    validator's prefill in the declared precision, and the replay against a KV-cached decode of
    its tokens in that precision. On the worker's device class honest work agrees almost
    exactly; None when it passes."""
    entry, policy = work.entry, work.policy
    sub, lease = entry.submission, entry.lease
    limits = acceptance.recheck
    err = declared_err(work, recs, acceptance)
    if not err <= limits.max_group_mant_err:
        return Refusal(
            "bad_proof",
            f"recheck in {sub.precision}: proof error {err:.3f} ulp > {limits.max_group_mant_err}",
        )
    logits = decode_logits(
        policy.lm, sub.prompt_token_ids, [c.token_ids for c in sub.completions], sub.precision
    )
    temperature = lease.sampling.temperature
    lengths = [len(c.token_ids) for c in sub.completions]
    device = policy.lm.device
    tokens = torch.as_tensor(
        [t for c in sub.completions for t in c.token_ids], dtype=torch.long, device=device
    )
    rows = [(lease.seed, i, k) for i, n in enumerate(lengths) for k in range(n)]
    played = replay(torch.cat(list(logits)).to(device), tokens, temperature, rows)
    zs = replay_z(
        policy.lm.cast("fp32"),
        played,
        tokens,
        hidden_noise(recs),
        temperature,
        acceptance.replay_noise_floor,
    ).cpu()
    # Judged where the model sampled, as in the first opinion: an environment's reply trails
    # the seeded choice by whatever it likes, and is checked exactly elsewhere.
    sampled = sampled_positions(sub)
    gaps = played.gaps.cpu().where(sampled, torch.zeros(()))
    zs = zs.where(sampled, torch.zeros(()))
    for i, part in enumerate(zip(gaps.split(lengths), zs.split(lengths), strict=True)):
        gap, z = float(part[0].max()), float(part[1].max())
        if not (gap <= limits.max_replay_gap and z <= limits.max_replay_z):
            return Refusal(
                "sampling_mismatch",
                f"recheck with a {sub.precision} decode: completion {i} trails the seeded "
                f"choice by {gap:.3f}, {z:.1f} times the honest noise (at most "
                f"{limits.max_replay_gap} and {limits.max_replay_z})",
            )
    return None


# --------------------------------------------------------------------------- the environment
ENVIRONMENT_REASONS = frozenset({"context_mismatch", "bad_termination", "reward_mismatch"})
"""Refusals on what the environment says (its replies, where it ends an episode, its score): an
environment that is not deterministic makes them of honest work."""


def environment_second_look(work: Work) -> str | None:
    """Before a worker is blamed for its environment's tokens or score: every branch's claimed
    turns replayed through the environment twice here and once in a fresh process
    (libs/environments/determinism.py). How the environment disagreed with itself, or None
    when it agrees with itself, and the refusal is the worker's."""
    sub, lease = work.entry.submission, work.entry.lease
    tok = work.policy.lm.tokenizer
    episodes = [
        Episode(
            lease.task_id,
            f"completion {i}",
            tuple(decode(tok, c.token_ids[a:b]) for a, b in c.sampled_spans),
        )
        for i, c in enumerate(sub.completions)
    ]
    return second_look(lease.env, lease.env_args, episodes)


# --------------------------------------------------------------------------- a batch
Settled = Literal["accept", "reject", "held"]


@dataclass
class Decision:
    """The settled verdict on one group: what the validator service encodes and commits.

    `accept`: trained on and attested; `reject`: refused, and slashed unless its reason is not
    the worker's fault; `held`: neither trained on nor slashed, either a suspect this validator
    cannot settle (`held_for_recheck`, for a validator of the worker's device class) or a
    refusal its environment's disagreement with itself explains (`env_nondeterministic`, for
    the operator to fix the environment). `refusal` says why (None when accepted); `judgement`
    is the first opinion and its evidence, for logs and metrics."""

    action: Settled
    refusal: Refusal | None
    judgement: Judgement

    @property
    def completions(self) -> list[VerifiedCompletion]:
        return self.judgement.completions if self.action == "accept" else []

    @property
    def suspect(self) -> bool:
        return self.judgement.outcome == "suspect"


def verify_batch(
    works: Sequence[Work],
    reward_tolerance: float = 1e-6,
    length: LengthReward | None = None,
    recheck: bool = True,
    device_class: str | None = None,
) -> list[Decision]:
    """Decide every submission of a batch, in order; never raises for a submission's sake.

    One recomputation per (policy version, precision) for the whole batch, one TOPLOC check per
    prover engine's limits; anything that fails batched is retried one group at a time, and a
    group that still makes the validator fail is refused as `validator_error` (never slashed)
    rather than sinking the batch. Suspects get `second_opinion` when `recheck`, then are
    settled (`settle`).
    `device_class`: the validator's own; work declared from it is also held against the
    validator's declared-precision numbers, and only there may a second opinion slash.
    """
    out: list[Decision | None] = [None] * len(works)
    # Each work's bands are resolved once, here, and passed down with it.
    bands = [acceptance_for(w.entry.submission.backend) for w in works]
    batches: dict[tuple[int, str], list[int]] = {}
    for i, (work, acceptance) in enumerate(zip(works, bands, strict=True)):
        if acceptance is None:
            refusal = Refusal(
                "malformed", f"no calibrated limits for backend {work.entry.submission.backend!r}"
            )
            out[i] = Decision("reject", refusal, Judgement("reject", refusal=refusal))
            continue
        key = (work.policy.version, work.entry.submission.precision)
        batches.setdefault(key, []).append(i)
    for (_, precision), idx in batches.items():
        group = [works[i] for i in idx]
        try:
            flat = recompute(group[0].policy.lm, [q for w in group for q in w.pairs()], precision)
            recs: list[list[Recomputed] | None] = []
            at = 0
            for w in group:
                n = len(w.entry.submission.completions)
                recs.append(flat[at : at + n])
                at += n
        except Exception:  # noqa: BLE001 - one bad group must not sink the batch
            recs = [None] * len(group)
        proofs: list[list[VerifyResult] | None] = [None] * len(group)
        # One proof check per engine's gross limits: a batch may mix engines.
        by_backend: dict[str, list[int]] = {}
        for j, r in enumerate(recs):
            if r is not None:
                by_backend.setdefault(group[j].entry.submission.backend, []).append(j)
        for ready in by_backend.values():
            try:
                checked = check_proofs(
                    [group[j] for j in ready],
                    [recs[j] for j in ready],  # type: ignore[misc]
                    bands[idx[ready[0]]],  # type: ignore[arg-type]
                )
                for j, res in zip(ready, checked, strict=True):
                    proofs[j] = res
            except Exception:  # noqa: BLE001 - checked group by group below
                pass
        for j, (i, work) in enumerate(zip(idx, group, strict=True)):
            same = device_class is not None and work.entry.submission.device_class == device_class
            judgement = judge_one(
                work,
                bands[i],
                recs[j],
                proofs[j],
                reward_tolerance,
                length,
                recheck,
                same,  # type: ignore[arg-type]
            )
            out[i] = decide(judgement, work.entry.submission.device_class, device_class)
    return [d for d in out if d is not None]


def judge_one(
    work: Work,
    acceptance: Acceptance,
    recs: Sequence[Recomputed] | None,
    proofs: Sequence[VerifyResult] | None,
    reward_tolerance: float,
    length: LengthReward | None,
    recheck: bool,
    same_class: bool = False,
) -> Judgement:
    """One group's first opinion (and a suspect's second), recomputing what the batch could
    not. The input's shape was checked before (`check_shapes`, `check_prompt`), so a failure
    here is the validator's own (a torch kernel refusing this CPU, memory): `validator_error`,
    which never slashes; a worker that finds input to crash it gains nothing either."""
    try:
        if recs is None:
            recs = recompute(work.policy.lm, work.pairs(), work.entry.submission.precision)
        evidence = measure_group(work, recs, acceptance, length, proofs, same_class)
        judgement = judge_group(work, evidence, acceptance, reward_tolerance)
        if judgement.outcome == "suspect" and recheck:
            judgement.rechecked = True
            judgement.second_opinion = second_opinion(work, recs, acceptance)
        why = judgement.refusal
        if judgement.outcome == "reject" and why is not None and why.reason in ENVIRONMENT_REASONS:
            judgement.environment = environment_second_look(work)
        return judgement
    except Refusal as rej:
        return Judgement("reject", refusal=rej)
    except Exception as exc:  # noqa: BLE001 - one group never crashes the validator
        return Judgement(
            "reject", refusal=Refusal("validator_error", f"{type(exc).__name__}: {exc}"[:300])
        )


def settle(judgement: Judgement, same_device_class: bool) -> Settled:
    """The rule that settles a judgement. A refusal the environment's disagreement with itself
    explains is held: neither trained on nor slashed. A suspect is accepted when the second
    opinion clears it; rejected (and slashed) only when that opinion, recomputed on the
    worker's declared device class, also fails it; otherwise held, for a validator of that
    class to settle."""
    if judgement.environment is not None:
        return "held"
    if judgement.outcome != "suspect":
        return judgement.outcome
    if judgement.rechecked and judgement.second_opinion is None:
        return "accept"
    if judgement.rechecked and same_device_class:
        return "reject"
    return "held"


def unexplained_environment_refusal(decision: Decision) -> bool:
    """A rejection on the environment's tokens in the context (`context_mismatch`) while the
    environment agreed with itself here: this machine alone cannot tell a forger from an
    environment that answers otherwise elsewhere, so it slashes only on evidence from beyond it
    (env_disputes.py). A claimed reward or end is the worker's own claim, checked as before."""
    why = decision.refusal
    return (
        decision.action == "reject"
        and why is not None
        and why.reason == "context_mismatch"
        and decision.judgement.environment is None
    )


def held_unsettled(decision: Decision, evidence: str) -> Decision:
    """`decision` held until other machines' evidence settles it (`env_unsettled`)."""
    first = decision.refusal.detail if decision.refusal else ""
    return Decision("held", Refusal("env_unsettled", f"{first}; {evidence}"), decision.judgement)


def decide(judgement: Judgement, worker_class: str, validator_class: str | None) -> Decision:
    """The judgement settled, with the refusal the worker and the chain are told."""
    settled = settle(judgement, worker_class == validator_class)
    if settled == "accept":
        return Decision("accept", None, judgement)
    if settled == "held" and judgement.environment is not None:
        first = judgement.refusal.detail if judgement.refusal else ""
        detail = f"{first}; replayed again, {judgement.environment}: held, not the worker's fault"
        return Decision("held", Refusal("env_nondeterministic", detail), judgement)
    if settled == "held":
        second = judgement.second_opinion.detail if judgement.second_opinion else "not rechecked"
        first = judgement.refusal.detail if judgement.refusal else ""
        detail = (
            f"suspect ({first}); the second opinion on {validator_class or 'this validator'} "
            f"({second}) cannot settle work from {worker_class}: held for a validator of that "
            "class"
        )
        return Decision("held", Refusal("held_for_recheck", detail), judgement)
    refusal = judgement.second_opinion or judgement.refusal
    assert refusal is not None, "a rejected judgement names its refusal"
    return Decision("reject", refusal, judgement)
