"""Answer a lease: seeded generation, TOPLOC proofs over the hidden states, a signed submission."""

from __future__ import annotations

from prime_swarm.libs.model.tokenizer import decode, encode
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.rl.envs import get_env
from prime_swarm.libs.rl.sampling import generate, prefill
from prime_swarm.libs.toploc import ProofContext, build_proof
from prime_swarm.protocol.messages import CompletionSample, Lease, RolloutSubmission


def answer_lease(policy: LoadedPolicy, lease: Lease) -> RolloutSubmission:
    model, tok = policy.model, policy.tokenizer
    env = get_env(lease.env)
    task = env.task_from_id(lease.task_id)
    prompt_ids = encode(tok, lease.prompt, add_bos=True)
    completions = generate(
        model,
        prompt_ids,
        group_size=lease.group_size,
        max_new_tokens=lease.sampling.max_new_tokens,
        temperature=lease.sampling.temperature,
        seed=lease.seed,
        eos_id=model.config.eos_token_id,
    )
    # Hidden states come from one batched prefill of prompt + completion: the exact tensors a
    # validator recomputes, so the proof compares like with like.
    states = prefill(model, [(prompt_ids, c.token_ids) for c in completions])
    samples = []
    for i, (c, st) in enumerate(zip(completions, states, strict=True)):
        ctx = ProofContext(
            model_hash=policy.model_hash,
            lease_id=lease.lease_id,
            sample_index=i,
            token_ids=c.token_ids,
        )
        samples.append(
            CompletionSample(
                token_ids=c.token_ids,
                finish_reason=c.finish_reason,
                proof=build_proof(st.hidden, ctx),
                claimed_reward=env.reward(task, decode(tok, c.token_ids)),
            )
        )
    return RolloutSubmission(
        lease_id=lease.lease_id,
        worker=lease.worker,
        pool_id=lease.pool_id,
        task_id=lease.task_id,
        policy_version=policy.version,
        prompt_token_ids=prompt_ids,
        completions=samples,
    )
