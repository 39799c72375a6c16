"""The validator's checks: what a submission must show, each failure with a named reason.

`measure_group` recomputes the evidence (proof statistics, replay gaps, rewards, log-probs) from
the validator's own prefill; `judge_group` holds it against the calibrated limits. They are split
so that the benchmark reports the very numbers the validator decides on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.tokenizer import decode, prompt_ids
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.rl.envs import get_env
from prime_swarm.libs.rl.forward import prefill_hidden as prefill_hidden  # the proof's prefill
from prime_swarm.libs.rl.logprobs import token_logprobs
from prime_swarm.libs.rl.reward import LengthReward, RewardParts, score
from prime_swarm.libs.toploc import (
    ProofContext,
    VerifyResult,
    group_contexts,
    pooled_mant_err_mean,
    verify_proofs_batch,
)
from prime_swarm.protocol.messages import SubmittedRollout, VerifiedCompletion

from .admission import Refusal
from .calibration import Acceptance, acceptance_for
from .noise import gumbel_rows, perturbed_scores


# --------------------------------------------------------------------------- recomputation
def replay_gaps(
    logits: torch.Tensor, token_ids: Sequence[int], temperature: float, seed: int, sample: int
) -> torch.Tensor:
    """Per position: best perturbed score minus the submitted token's (0 when it is the argmax).

    An honest token's gap is 0 up to near-ties that decode and prefill noise can flip; a token
    the seeded noise did not choose trails by O(1).
    """
    tokens = torch.as_tensor(list(token_ids), dtype=torch.long, device=logits.device)
    return row_gaps(logits, tokens, temperature, [(seed, sample, k) for k in range(len(tokens))])


def row_gaps(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float,
    rows: Sequence[tuple[int, int, int]],
) -> torch.Tensor:
    """`replay_gaps` for positions of any completions at once: logits [N, V], tokens [N], and
    each position's noise row (seed, sample, position)."""
    if temperature > 0:
        scores = perturbed_scores(
            logits, temperature, gumbel_rows(list(rows), logits.shape[-1], logits.device)
        )
    else:
        scores = logits.float()
    return scores.max(dim=-1).values - scores.gather(-1, tokens[:, None]).squeeze(-1)


def termination_ok(
    token_ids: Sequence[int], finish_reason: str, eos_ids: frozenset[int], max_new_tokens: int
) -> bool:
    """Does the completion stop where honest decoding would: at its first EOS, or at the cap?"""
    n_eos = sum(t in eos_ids for t in token_ids)
    if finish_reason == "eos":
        return n_eos == 1 and token_ids[-1] in eos_ids and len(token_ids) <= max_new_tokens
    if finish_reason == "length":
        return n_eos == 0 and len(token_ids) == max_new_tokens
    return False


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
def check_proofs(
    groups: Sequence[tuple[SubmittedRollout, LoadedPolicy]],
    hiddens: Sequence[Sequence[torch.Tensor]],
    acceptance: Acceptance,
) -> list[list[VerifyResult]]:
    """The TOPLOC check of many groups' proofs in one batch (its field arithmetic costs per
    call, not per chunk), each against the validator's hidden states for that group."""
    flat_h: list[torch.Tensor] = []
    flat_p: list[bytes] = []
    flat_c: list[ProofContext] = []
    for (entry, policy), group_h in zip(groups, hiddens, strict=True):
        sub, lease = entry.submission, entry.lease
        flat_h.extend(group_h)
        flat_p.extend(c.proof for c in sub.completions)
        flat_c.extend(
            group_contexts(
                policy.model_hash, lease.lease_id, [c.token_ids for c in sub.completions]
            )
        )
    results = verify_proofs_batch(flat_h, flat_p, flat_c, acceptance.thresholds)
    out, at = [], 0
    for group_h in hiddens:
        out.append(results[at : at + len(group_h)])
        at += len(group_h)
    return out


@dataclass
class CompletionEvidence:
    proof: VerifyResult
    max_replay_gap: float
    first_bad_position: int | None
    reward: RewardParts
    logprobs: list[float]


@torch.no_grad()
def measure_group(
    entry: SubmittedRollout,
    policy: LoadedPolicy,
    hiddens: Sequence[torch.Tensor],
    acceptance: Acceptance,
    length: LengthReward | None = None,
    proofs: Sequence[VerifyResult] | None = None,
) -> list[CompletionEvidence]:
    """Recompute everything the verdict rests on, from the validator's own hidden states.
    `proofs`: the group's proofs already checked (`check_proofs`, batched over many groups)."""
    length = length or LengthReward()
    sub, lease = entry.submission, entry.lease
    # The head in the declared precision too: the worker's logits came from those weights.
    lm = policy.lm.cast(sub.precision)
    env = get_env(lease.env)
    task = env.task_from_id(lease.task_id)
    if proofs is None:
        proofs = check_proofs([(entry, policy)], [list(hiddens)], acceptance)[0]
    temperature = lease.sampling.temperature
    # The whole group's positions in one head, one noise gather and one softmax: per-completion
    # calls cost more in dispatch than in arithmetic at these sizes.
    lengths = [len(c.token_ids) for c in sub.completions]
    tokens = torch.as_tensor(
        [t for c in sub.completions for t in c.token_ids], dtype=torch.long, device=lm.device
    )
    logits = lm.head_logits(torch.cat([h.to(lm.device) for h in hiddens]))
    rows = [(lease.seed, i, k) for i, n in enumerate(lengths) for k in range(n)]
    gaps = row_gaps(logits, tokens, temperature, rows)
    logprobs = token_logprobs(logits, tokens, temperature).cpu()
    bad = (gaps > acceptance.replay_tolerance).cpu()
    gaps = gaps.cpu()
    out = []
    at = 0
    for c, proof, n in zip(sub.completions, proofs, lengths, strict=True):
        mine = slice(at, at + n)
        at += n
        bad_at = torch.nonzero(bad[mine])
        out.append(
            CompletionEvidence(
                proof=proof,
                max_replay_gap=float(gaps[mine].max()),
                first_bad_position=int(bad_at[0, 0]) if len(bad_at) else None,
                reward=score(
                    env.reward(task, decode(lm.tokenizer, c.token_ids)),
                    n,
                    lease.target_tokens,
                    length,
                ),
                logprobs=logprobs[mine].tolist(),
            )
        )
    return out


def judge_group(
    entry: SubmittedRollout,
    policy: LoadedPolicy,
    evidence: Sequence[CompletionEvidence],
    acceptance: Acceptance,
    reward_tolerance: float,
) -> list[VerifiedCompletion]:
    """Proofs (each chunk, then the group pooled), sampling replay, termination and reward of
    every completion, in that order."""
    sub, lease = entry.submission, entry.lease
    for i, ev in enumerate(evidence):
        if not ev.proof.ok:
            raise Refusal("bad_proof", f"completion {i}: {ev.proof.reason}")
    pooled = pooled_mant_err_mean([ev.proof for ev in evidence])
    if not pooled <= acceptance.max_group_mant_err_mean:
        raise Refusal(
            "bad_proof",
            f"group mantissa error {pooled:.3f} ulp > {acceptance.max_group_mant_err_mean} at "
            f"{sub.precision}: not the claimed weights",
        )
    out: list[VerifiedCompletion] = []
    for i, (c, ev) in enumerate(zip(sub.completions, evidence, strict=True)):
        if ev.first_bad_position is not None:
            raise Refusal(
                "sampling_mismatch",
                f"completion {i}: token {ev.first_bad_position} is not the seeded choice "
                f"(trails it by up to {ev.max_replay_gap:.3f}, tolerance "
                f"{acceptance.replay_tolerance})",
            )
        if not termination_ok(
            c.token_ids, c.finish_reason, policy.lm.eos_ids, lease.sampling.max_new_tokens
        ):
            raise Refusal(
                "bad_termination",
                f"completion {i} ({c.finish_reason}) does not stop at its first EOS or at "
                f"max_new_tokens={lease.sampling.max_new_tokens}",
            )
        # The worker claims the task score only: the length part needs no pool settings.
        claimed, task = c.claimed_reward, ev.reward.task
        if claimed is not None and abs(claimed - task) > reward_tolerance:
            raise Refusal("reward_mismatch", f"completion {i} claims {claimed}, scores {task}")
        out.append(
            VerifiedCompletion(
                token_ids=c.token_ids,
                logprobs=ev.logprobs,
                inference_logprobs=c.logprobs,
                reward=ev.reward.total,
                task_reward=task,
                length_reward=ev.reward.length,
            )
        )
    return out


def check_completions(
    entry: SubmittedRollout,
    policy: LoadedPolicy,
    hiddens: Sequence[torch.Tensor],
    reward_tolerance: float = 1e-6,
    acceptance: Acceptance | None = None,
    length: LengthReward | None = None,
    proofs: Sequence[VerifyResult] | None = None,
) -> list[VerifiedCompletion]:
    """Measure and judge a group against the limits calibrated for its prover engine."""
    acceptance = acceptance or acceptance_for(entry.submission.backend)
    if acceptance is None:
        raise Refusal("malformed", f"no calibrated limits for backend {entry.submission.backend!r}")
    evidence = measure_group(entry, policy, hiddens, acceptance, length, proofs)
    return judge_group(entry, policy, evidence, acceptance, reward_tolerance)
