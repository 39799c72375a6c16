"""The validator's checks on real generations of a real (tiny, untrained) model: an honest
group passes; each kind of cheating fails with its own reason."""

from __future__ import annotations

import time

import pytest
import torch

from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.tokenizer import build_tokenizer
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.rl.sampling import prefill_at as prefill
from prime_swarm.libs.toploc import ProofContext, build_proof
from prime_swarm.protocol.messages import (
    Lease,
    SamplingParams,
    SubmittedRollout,
)
from prime_swarm.services.validator import checks
from prime_swarm.services.worker.rollout import answer_lease

WORKER = "0x" + "ab" * 20


@pytest.fixture(scope="module")
def policy() -> LoadedPolicy:
    torch.manual_seed(0)
    return LoadedPolicy(3, "cd" * 32, init_tiny_model(1).eval(), build_tokenizer())


@pytest.fixture(scope="module")
def lease() -> Lease:
    return Lease(
        lease_id="lease-1",
        worker=WORKER,
        pool_id=1,
        env="reverse",
        task_id="reverse/train/42",
        prompt="rev 4821=",
        group_size=4,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=8),
        seed=1234,
        min_policy_version=1,
        expires_at=time.time() + 60,
    )


@pytest.fixture(scope="module")
def honest(policy: LoadedPolicy, lease: Lease) -> SubmittedRollout:
    from prime_swarm.libs.rl.envs import get_env

    lease = lease.model_copy(
        update={"prompt": get_env("reverse").task_from_id(lease.task_id).prompt}
    )
    return SubmittedRollout(submission_id="s1", lease=lease, submission=answer_lease(policy, lease))


def run_all(
    entry: SubmittedRollout, policy: LoadedPolicy, validator_policy: LoadedPolicy | None = None
) -> list:
    vp = validator_policy or policy
    checks.check_lease(entry)
    checks.check_version(entry, current_version=4, async_level=2)
    checks.check_prompt(entry, vp)
    seqs = [(entry.submission.prompt_token_ids, c.token_ids) for c in entry.submission.completions]
    return checks.check_completions(
        entry, vp, prefill(vp.model, seqs), checks.REPLAY_TOLERANCE, 1e-6
    )


def with_completion(entry: SubmittedRollout, i: int, **update: object) -> SubmittedRollout:
    comps = list(entry.submission.completions)
    comps[i] = comps[i].model_copy(update=update)
    sub = entry.submission.model_copy(update={"completions": comps})
    return entry.model_copy(update={"submission": sub})


def rejected(entry: SubmittedRollout, policy: LoadedPolicy, **kw: object) -> str:
    with pytest.raises(checks.Rejection) as err:
        run_all(entry, policy, **kw)
    return err.value.reason


def test_honest_group_passes_with_recomputed_rewards(honest, policy) -> None:  # noqa: ANN001
    out = run_all(honest, policy)
    assert len(out) == 4
    claimed = [c.claimed_reward for c in honest.submission.completions]
    assert [c.reward for c in out] == claimed
    assert all(len(c.logprobs) == len(c.token_ids) for c in out)


def test_other_weights_fail_the_proof(honest, policy) -> None:  # noqa: ANN001
    other = LoadedPolicy(3, policy.model_hash, init_tiny_model(2).eval(), policy.tokenizer)
    assert rejected(honest, policy, validator_policy=other) == "bad_proof"


def test_one_changed_token_is_caught(honest, policy) -> None:  # noqa: ANN001
    tokens = list(honest.submission.completions[0].token_ids)
    tokens[0] = (tokens[0] + 1) % policy.model.config.vocab_size
    # The proof was built for the old tokens: its context no longer matches.
    assert rejected(with_completion(honest, 0, token_ids=tokens), policy) in {
        "bad_proof",
        "sampling_mismatch",
        "bad_termination",
    }


def test_inflated_reward_claim_is_caught(honest, policy) -> None:  # noqa: ANN001
    c = honest.submission.completions[1]
    fake = with_completion(honest, 1, claimed_reward=min(1.0, (c.claimed_reward or 0) + 0.5))
    assert rejected(fake, policy) == "reward_mismatch"


def test_wrong_group_size_and_stale_version(honest, policy) -> None:  # noqa: ANN001
    sub = honest.submission.model_copy(update={"completions": honest.submission.completions[:2]})
    assert rejected(honest.model_copy(update={"submission": sub}), policy) == "lease_mismatch"
    with pytest.raises(checks.Rejection) as err:
        checks.check_version(honest, current_version=9, async_level=2)
    assert err.value.reason == "stale_policy"
    with pytest.raises(checks.Rejection) as err:
        checks.check_version(honest, current_version=2, async_level=2)
    assert err.value.reason == "unknown_policy"


def test_malformed_proof_is_a_rejection_not_a_crash(honest, policy) -> None:  # noqa: ANN001
    for proof in (b"", b"\x00" * 290, b"garbage"):
        assert rejected(with_completion(honest, 2, proof=proof), policy) == "bad_proof"


def test_claimed_eos_that_is_not_there(honest, policy) -> None:  # noqa: ANN001
    c = honest.submission.completions[3]
    flipped = "length" if c.finish_reason == "eos" else "eos"
    assert rejected(with_completion(honest, 3, finish_reason=flipped), policy) == "bad_termination"


def test_changed_token_with_a_rebuilt_proof_fails_the_sampling_replay(honest, policy) -> None:  # noqa: ANN001
    # A cheater who runs the right model can make a valid proof for tokens of its choosing;
    # the seeded Gumbel-max replay is what stops it.
    c = honest.submission.completions[0]
    tokens = list(c.token_ids)
    eos = policy.model.config.eos_token_id
    tokens[0] = next(
        t for t in range(4, policy.model.config.vocab_size) if t not in (tokens[0], eos)
    )
    (pre,) = prefill(policy.model, [(honest.submission.prompt_token_ids, tokens)])
    ctx = ProofContext(
        model_hash=policy.model_hash,
        lease_id=honest.lease.lease_id,
        sample_index=0,
        token_ids=tokens,
    )
    forged = with_completion(honest, 0, token_ids=tokens, proof=build_proof(pre.hidden, ctx))
    assert rejected(forged, policy) in {"sampling_mismatch", "bad_termination"}


def test_out_of_vocabulary_tokens_are_malformed_not_a_crash(honest, policy) -> None:  # noqa: ANN001
    for bad in ([10**6], [-1], [3] * 200):
        entry = with_completion(honest, 0, token_ids=bad)
        with pytest.raises(checks.Rejection) as err:
            checks.check_shapes(entry, policy)
        assert err.value.reason == "malformed"


def test_fp32_worker_fails_the_precision_fingerprint(honest, policy) -> None:  # noqa: ANN001
    from prime_swarm.services.worker.rollout import answer_lease as answer
    from prime_swarm.services.worker.torch_backend import TorchBackend

    sub = answer(policy, honest.lease, backend=TorchBackend("fp32"))
    entry = honest.model_copy(update={"submission": sub})
    with pytest.raises(checks.Rejection) as err:
        run_all(entry, policy)
    assert err.value.reason == "bad_proof" and "precision" in err.value.detail
