"""The checks a submission must pass, each failing with a named reason.

Pure functions of (submission, lease, recomputed model outputs): the service loop only gathers
their inputs. Order matters: cheap structural checks first, the prefill-backed ones after.
"""

from __future__ import annotations

from dataclasses import dataclass

from prime_swarm.libs.model.tokenizer import decode, encode
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.rl.defaults import RL
from prime_swarm.libs.rl.envs import get_env
from prime_swarm.libs.rl.sampling import (
    PrefillOutput,
    completion_logprobs,
    replay_check,
    termination_ok,
)
from prime_swarm.libs.toploc import exact_fraction, group_contexts, verify_proofs_batch
from prime_swarm.protocol.messages import (
    RejectReason,
    SubmittedRollout,
    VerifiedCompletion,
)

MIN_EXACT_FRACTION = 0.9
"""Least share of a group's committed top-k values that a recomputation at the pool's precision
(bf16, canonical layout) must reproduce bit for bit. Measured by bench/toploc_bench.py: honest
bf16 groups reproduce all of them on the same kind of device under any batch size, thread count
or batch composition; the same tokens computed in fp32 or fp16 (then rounded to bf16) reproduce
about a third (never above ~0.6). 0.9 leaves room for kernel differences across devices."""


REPLAY_TOLERANCE = RL.replay_tol
"""Near-tie slack (perturbed-score units) for the Gumbel replay. With the canonical full-context
layout the worker's decode logits and the validator's prefill logits are bit-identical on one
kind of device (bench/toploc_bench.py: largest honest gap 0.0 over 8000 completions); the slack
is only for kernel differences across devices, and small enough that a worker cannot steer a
token away from the seeded choice except at genuine near-ties."""


@dataclass
class Rejection(Exception):
    reason: RejectReason
    detail: str


def check_lease(entry: SubmittedRollout, policy_tokenizer: object | None = None) -> None:
    sub, lease = entry.submission, entry.lease
    if sub.lease_id != lease.lease_id or sub.worker.lower() != lease.worker.lower():
        raise Rejection("lease_mismatch", "submission is not for this lease or this worker")
    if sub.task_id != lease.task_id or sub.pool_id != lease.pool_id:
        raise Rejection("lease_mismatch", "task or pool differ from the lease")
    if len(sub.completions) != lease.group_size:
        raise Rejection(
            "lease_mismatch",
            f"{len(sub.completions)} completions for group size {lease.group_size}",
        )
    for i, c in enumerate(sub.completions):
        if not c.token_ids:
            raise Rejection("bad_termination", f"completion {i} is empty")
        if len(c.token_ids) > lease.sampling.max_new_tokens:
            raise Rejection("bad_termination", f"completion {i} exceeds max_new_tokens")


def check_shapes(entry: SubmittedRollout, policy: LoadedPolicy) -> None:
    """Token ids the model can embed and sequences it can hold: a submission must never be able
    to crash the batched prefill it shares with other workers' submissions."""
    cfg = policy.model.config
    prompt = entry.submission.prompt_token_ids
    for i, c in enumerate(entry.submission.completions):
        if min(c.token_ids) < 0 or max(c.token_ids) >= cfg.vocab_size:
            raise Rejection("malformed", f"completion {i} has token ids outside the vocabulary")
        if len(prompt) + len(c.token_ids) > cfg.block_size:
            raise Rejection("malformed", f"completion {i} overflows the model's context")


def check_version(entry: SubmittedRollout, current_version: int, async_level: int) -> None:
    v = entry.submission.policy_version
    if v > current_version:
        raise Rejection("unknown_policy", f"v{v} was never announced (latest v{current_version})")
    oldest = max(current_version - async_level, entry.lease.min_policy_version)
    if v < oldest:
        raise Rejection("stale_policy", f"v{v} is older than the oldest admitted v{oldest}")


def check_prompt(entry: SubmittedRollout, policy: LoadedPolicy) -> None:
    expected = encode(policy.tokenizer, entry.lease.prompt, add_bos=True)
    if entry.submission.prompt_token_ids != expected:
        raise Rejection("lease_mismatch", "prompt tokens differ from the leased prompt")


def check_completions(
    entry: SubmittedRollout,
    policy: LoadedPolicy,
    prefilled: list[PrefillOutput],
    replay_tolerance: float,
    reward_tolerance: float,
    min_exact_fraction: float = MIN_EXACT_FRACTION,
) -> list[VerifiedCompletion]:
    """Proof, sampling replay, termination and reward of every completion in the group."""
    sub, lease = entry.submission, entry.lease
    eos = policy.model.config.eos_token_id
    env = get_env(lease.env)
    task = env.task_from_id(lease.task_id)
    contexts = group_contexts(
        policy.model_hash, lease.lease_id, [c.token_ids for c in sub.completions]
    )
    results = verify_proofs_batch(
        [pre.hidden for pre in prefilled], [c.proof for c in sub.completions], contexts
    )
    for i, result in enumerate(results):
        if not result.ok:
            raise Rejection("bad_proof", f"completion {i}: {result.reason}")
    exact = exact_fraction(results)
    if exact < min_exact_fraction:
        raise Rejection(
            "bad_proof",
            f"hidden states not computed at the pool's precision: {exact:.3f} of committed "
            f"values reproduced exactly < {min_exact_fraction}",
        )
    out: list[VerifiedCompletion] = []
    for i, (c, pre) in enumerate(zip(sub.completions, prefilled, strict=True)):
        ok, bad_pos = replay_check(
            pre.logits, c.token_ids, lease.sampling.temperature, lease.seed, i, replay_tolerance
        )
        if not ok:
            raise Rejection(
                "sampling_mismatch", f"completion {i}: token {bad_pos} is not the seeded choice"
            )
        if not termination_ok(c.token_ids, c.finish_reason, eos, lease.sampling.max_new_tokens):
            raise Rejection(
                "bad_termination",
                f"completion {i} ({c.finish_reason}) does not stop at its first EOS or at "
                f"max_new_tokens={lease.sampling.max_new_tokens}",
            )
        reward = env.reward(task, decode(policy.tokenizer, c.token_ids))
        if c.claimed_reward is not None and abs(c.claimed_reward - reward) > reward_tolerance:
            raise Rejection(
                "reward_mismatch", f"completion {i} claims {c.claimed_reward}, scores {reward}"
            )
        out.append(
            VerifiedCompletion(
                token_ids=c.token_ids,
                logprobs=completion_logprobs(pre, c.token_ids, lease.sampling.temperature),
                reward=reward,
            )
        )
    return out
