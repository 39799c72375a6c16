"""The validator's checks on real generations of a real (tiny, untrained) model, run in the
validator's order: an honest group passes; each kind of cheating fails with its own reason."""

from __future__ import annotations

import copy
import time

import pytest
import torch
from lease_answers import answer_lease

from prime_swarm.libs.environments import load_env
from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.hardware import device_class
from prime_swarm.libs.model.hf_backend import HFBackend
from prime_swarm.libs.model.noise import gumbel_rows
from prime_swarm.libs.model.tokenizer import build_tokenizer
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.rollout import calibration, verify
from prime_swarm.libs.rollout.admission import Refusal, check_admission
from prime_swarm.libs.rollout.calibration import acceptance_for
from prime_swarm.libs.rollout.recompute import prefill_hidden
from prime_swarm.libs.rollout.verify import (
    Work,
    check_prompt,
    check_shapes,
    verify_batch,
)
from prime_swarm.libs.toploc import build_proof, group_contexts
from prime_swarm.protocol.messages import (
    Lease,
    SamplingParams,
    SubmittedRollout,
    VerifiedCompletion,
)

WORKER = "0x" + "ab" * 20
GROUP, MAX_NEW = 4, 8
CURRENT, ASYNC_LEVEL = 4, 2


pytestmark = pytest.mark.usefixtures("inference")


@pytest.fixture(scope="module")
def policy() -> LoadedPolicy:
    return LoadedPolicy(3, "cd" * 32, CausalLM(init_tiny_model(1), build_tokenizer()))


@pytest.fixture(scope="module")
def lease() -> Lease:
    task_id = "reverse/train/42"
    return Lease(
        lease_id="lease-1",
        worker=WORKER,
        pool_id=1,
        work_id=0,
        env="reverse",
        task_id=task_id,
        prompt=load_env("reverse").task_from_id(task_id).prompt,
        group_size=GROUP,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW),
        seed=1234,
        min_policy_version=1,
        expires_at=time.time() + 3600,
    )


@pytest.fixture(scope="module")
def honest(policy: LoadedPolicy, lease: Lease) -> SubmittedRollout:
    sub = answer_lease(policy, lease, HFBackend("bf16"))
    return SubmittedRollout(submission_id="s1", lease=lease, submission=sub)


def run_all(
    entry: SubmittedRollout, policy: LoadedPolicy, validator_policy: LoadedPolicy | None = None
) -> list[VerifiedCompletion]:
    """Every check, in the order services/validator/loop.py applies them, settled as it does."""
    vp = validator_policy or policy
    check_admission(entry.submission, entry.lease, CURRENT, ASYNC_LEVEL)
    check_prompt(entry, vp.lm)
    check_shapes(entry, vp.lm)
    (decision,) = verify_batch(
        [Work(entry, vp)], reward_tolerance=1e-6, device_class=device_class("cpu")
    )
    if decision.action != "accept":
        assert decision.refusal is not None
        raise decision.refusal
    return decision.completions


def with_completion(entry: SubmittedRollout, i: int, **update: object) -> SubmittedRollout:
    comps = list(entry.submission.completions)
    comps[i] = comps[i].model_copy(update=update)
    return with_submission(entry, completions=comps)


def with_submission(entry: SubmittedRollout, **update: object) -> SubmittedRollout:
    return entry.model_copy(update={"submission": entry.submission.model_copy(update=update)})


def refused(entry: SubmittedRollout, policy: LoadedPolicy, **kw: object) -> Refusal:
    with pytest.raises(Refusal) as err:
        run_all(entry, policy, **kw)  # type: ignore[arg-type]
    return err.value


def forged_proof(policy: LoadedPolicy, entry: SubmittedRollout, i: int, tokens: list[int]) -> bytes:
    """What a cheater running the right model can do: prove tokens of its own choosing."""
    (hidden,) = prefill_hidden(policy.lm, [(entry.submission.prompt_token_ids, tokens)], "bf16")
    comps = [c.token_ids for c in entry.submission.completions]
    comps[i] = tokens
    ctx = group_contexts(policy.model_hash, entry.lease.lease_id, comps)[i]
    return build_proof(hidden, ctx)


def test_honest_group_passes_with_recomputed_rewards(
    honest: SubmittedRollout, policy: LoadedPolicy
) -> None:
    sub = honest.submission
    assert sub.backend == "hf" and sub.policy_version == policy.version
    assert len(sub.completions) == GROUP
    assert sub.prompt_token_ids[0] == policy.lm.tokenizer.bos_token_id
    out = run_all(honest, policy)
    assert len(out) == GROUP
    assert [c.reward for c in out] == [c.claimed_reward for c in sub.completions]
    assert [c.token_ids for c in out] == [c.token_ids for c in sub.completions]
    for c in out:
        assert len(c.logprobs) == len(c.token_ids)
        assert all(lp <= 0.0 and lp == lp for lp in c.logprobs)  # log-probs, no NaN


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_fp32_and_fp16_workers_are_accepted(
    honest: SubmittedRollout, policy: LoadedPolicy, precision: str
) -> None:
    # More precise (or just different) compute is more work, not less: it must pass.
    sub = answer_lease(policy, honest.lease, HFBackend(precision))
    entry = honest.model_copy(update={"submission": sub})
    out = run_all(entry, policy)
    assert [c.reward for c in out] == [c.claimed_reward for c in sub.completions]


def test_cheaper_compute_than_the_declared_precision_is_refused(
    honest: SubmittedRollout, policy: LoadedPolicy
) -> None:
    # bf16 compute declared as fp32: against the fp32 reference its bf16 rounding is many times
    # the (nil) honest noise of fp32, whatever noise floor the ratio divides by.
    sub = answer_lease(policy, honest.lease, HFBackend("bf16"))
    entry = with_submission(honest.model_copy(update={"submission": sub}), precision="fp32")
    rej = refused(entry, policy)
    assert rej.reason == "bad_proof" and "weight ratio" in rej.detail


def test_a_misdeclared_precision_is_caught_by_the_second_opinion(
    honest: SubmittedRollout, policy: LoadedPolicy
) -> None:
    # fp32 compute declared as bf16 sits closer to the fp32 reference than bf16 would (the first
    # check accepts its weights), but on the validator's own device class the declared-precision
    # recomputation agrees bit for bit with honest work, and this does not: the declaration is
    # what a second opinion reproduces, so it must be true.
    sub = answer_lease(policy, honest.lease, HFBackend("fp32"))
    entry = with_submission(honest.model_copy(update={"submission": sub}), precision="bf16")
    rej = refused(entry, policy)
    assert rej.reason == "bad_proof" and "recheck in bf16" in rej.detail


def test_int8_quantized_weights_fail_the_pooled_group_check(
    honest: SubmittedRollout, policy: LoadedPolicy
) -> None:
    # Per-channel int8 quantize-dequantize: single chunks stay within the per-chunk limits, but
    # almost every committed value moves by a fraction of an ulp, which the group pools.
    module = copy.deepcopy(policy.lm.module)
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim >= 2:
                # An all-zero row (the pad token's embedding) keeps its zeros, not 0/0.
                scale = (p.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-30)
                p.copy_((p / scale).round().clamp(-127, 127) * scale)
    cheat = LoadedPolicy(policy.version, policy.model_hash, CausalLM(module, policy.lm.tokenizer))
    sub = answer_lease(cheat, honest.lease, HFBackend("bf16"))
    rej = refused(honest.model_copy(update={"submission": sub}), policy)
    # Either the fp32 ratio rejects it outright, or it is a suspect whose second opinion (the
    # same-class recomputation, which honest work matches bit for bit) fails it.
    assert rej.reason == "bad_proof"
    assert "weight ratio" in rej.detail or "recheck in bf16" in rej.detail


def test_other_weights_fail(honest: SubmittedRollout, policy: LoadedPolicy) -> None:
    other = LoadedPolicy(3, policy.model_hash, CausalLM(init_tiny_model(2), build_tokenizer()))
    # The proof is what catches it first: hidden states of other weights look nothing alike.
    rej = refused(honest, policy, validator_policy=other)
    assert rej.reason == "bad_proof" and "mismatches" in rej.detail


def test_one_changed_token_is_caught(honest: SubmittedRollout, policy: LoadedPolicy) -> None:
    tokens = list(honest.submission.completions[0].token_ids)
    tokens[0] = (tokens[0] + 1) % policy.lm.vocab_size
    # The proof was built for the old tokens: its context no longer matches.
    rej = refused(with_completion(honest, 0, token_ids=tokens), policy)
    assert rej.reason == "bad_proof" and "another context" in rej.detail


def test_changed_token_with_a_rebuilt_proof_fails_the_sampling_replay(
    honest: SubmittedRollout, policy: LoadedPolicy
) -> None:
    # A valid proof for tokens of the cheater's choosing: the seeded Gumbel-max replay stops it.
    c = honest.submission.completions[0]
    tokens = list(c.token_ids)
    # The token the seeded noise disfavours most at that position: on this untrained (nearly
    # flat) model it trails the seeded choice by several units, far outside any tolerance.
    noise = gumbel_rows([(honest.lease.seed, 0, 0)], 256)[0]  # byte tokens only: never an EOS
    tokens[0] = int(noise.argmin())
    assert tokens[0] != c.token_ids[0]
    forged = with_completion(
        honest, 0, token_ids=tokens, proof=forged_proof(policy, honest, 0, tokens)
    )
    rej = refused(forged, policy)
    assert rej.reason == "sampling_mismatch" and "token 0" in rej.detail


def test_inflated_reward_claim_is_caught(honest: SubmittedRollout, policy: LoadedPolicy) -> None:
    c = honest.submission.completions[1]
    assert c.claimed_reward is not None
    inflated = 1.0 if c.claimed_reward < 0.5 else 0.0  # at least 0.5 away from the truth
    rej = refused(with_completion(honest, 1, claimed_reward=inflated), policy)
    assert rej.reason == "reward_mismatch" and "completion 1" in rej.detail


def test_wrong_group_size_and_stale_version(honest: SubmittedRollout, policy: LoadedPolicy) -> None:
    short = with_submission(honest, completions=honest.submission.completions[:2])
    assert refused(short, policy).reason == "lease_mismatch"
    sub, lease = honest.submission, honest.lease
    with pytest.raises(Refusal) as err:
        check_admission(sub, lease, current_version=9, async_level=ASYNC_LEVEL)
    assert err.value.reason == "stale_policy"
    with pytest.raises(Refusal) as err:
        check_admission(sub, lease, current_version=2, async_level=ASYNC_LEVEL)
    assert err.value.reason == "unknown_policy"
    # The lease's own floor binds too, even when the staleness bound would admit it.
    strict = lease.model_copy(update={"min_policy_version": 4})
    with pytest.raises(Refusal) as err:
        check_admission(sub, strict, current_version=4, async_level=ASYNC_LEVEL)
    assert err.value.reason == "stale_policy"
    check_admission(sub, lease, current_version=5, async_level=ASYNC_LEVEL)  # 5 - 2 <= 3


def test_submission_for_another_lease_or_worker(
    honest: SubmittedRollout, policy: LoadedPolicy
) -> None:
    for update in ({"lease_id": "lease-2"}, {"worker": "0x" + "ef" * 20}, {"task_id": "x/1"}):
        assert refused(with_submission(honest, **update), policy).reason == "lease_mismatch"
    # Prompt tokens other than the leased prompt's.
    prompt = [*honest.submission.prompt_token_ids, 20]
    assert refused(with_submission(honest, prompt_token_ids=prompt), policy).reason == (
        "lease_mismatch"
    )


def test_malformed_proof_is_a_refusal_not_a_crash(
    honest: SubmittedRollout, policy: LoadedPolicy
) -> None:
    good = honest.submission.completions[2].proof
    for proof in (b"", b"\x00" * 290, b"garbage", good[:-1], good + b"\x00"):
        rej = refused(with_completion(honest, 2, proof=proof), policy)
        assert rej.reason == "bad_proof" and "completion 2" in rej.detail


def test_claimed_eos_that_is_not_there(honest: SubmittedRollout, policy: LoadedPolicy) -> None:
    c = honest.submission.completions[3]
    flipped = "length" if c.finish_reason == "eos" else "eos"
    rej = refused(with_completion(honest, 3, finish_reason=flipped), policy)
    assert rej.reason == "bad_termination"


def test_a_truncated_completion_with_its_own_proof_is_bad_termination(
    honest: SubmittedRollout, policy: LoadedPolicy
) -> None:
    # Every token of a prefix replays and its proof can be rebuilt, but honest decoding would not
    # have stopped there: neither at an EOS nor at max_new_tokens.
    c = honest.submission.completions[0]
    assert len(c.token_ids) > 2 and not set(c.token_ids[:2]) & policy.lm.eos_ids
    prefix = c.token_ids[:2]
    for reason in ("length", "eos"):
        cut = with_completion(
            honest,
            0,
            token_ids=prefix,
            finish_reason=reason,
            proof=forged_proof(policy, honest, 0, prefix),
        )
        assert refused(cut, policy).reason == "bad_termination"


def test_out_of_vocabulary_tokens_are_malformed_not_a_crash(
    honest: SubmittedRollout, policy: LoadedPolicy
) -> None:
    too_long = [3] * (policy.lm.context_len + 1 - len(honest.submission.prompt_token_ids))
    for bad in ([10**6], [-1], [policy.lm.vocab_size], too_long):
        entry = with_completion(honest, 0, token_ids=bad)
        with pytest.raises(Refusal) as err:
            check_shapes(entry, policy.lm)
        assert err.value.reason == "malformed"
    # A completion that fits exactly is not malformed.
    fits = too_long[:-1]
    check_shapes(with_completion(honest, 0, token_ids=fits), policy.lm)


def test_the_validators_own_failure_is_refused_and_never_slashed(
    honest: SubmittedRollout, policy: LoadedPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What torch 2.13 raised on a validator capped to AVX2 kernels on an AMX CPU, for every
    honest python-tool group (bench-stacks, 2026-12-03): the validator's fault, not the work's."""

    def refuses_this_cpu(*args: object, **kwargs: object) -> None:
        raise RuntimeError("pack_vnni2 is only supported when avx512 is supported")

    monkeypatch.setattr(verify, "measure_group", refuses_this_cpu)
    (decision,) = verify_batch([Work(honest, policy)])
    assert decision.action == "reject" and decision.refusal is not None
    assert decision.refusal.reason == "validator_error"
    assert "pack_vnni2" in decision.refusal.detail
    assert "validator_error" in verify.NOT_SLASHED


def test_an_uncalibrated_backend_is_refused(
    honest: SubmittedRollout, policy: LoadedPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert acceptance_for("vllm") is not None
    # An engine nobody measured (a new engine, before its bench-toploc run).
    monkeypatch.setattr(calibration, "ENGINES", ("hf",))
    assert acceptance_for("vllm") is None
    entry = with_submission(honest, backend="vllm")
    (decision,) = verify_batch([Work(entry, policy)])
    assert decision.action == "reject" and decision.refusal is not None
    assert decision.refusal.reason == "malformed"


def test_the_format_part_is_the_validators_own_and_weighed_by_the_lease(
    honest: SubmittedRollout, policy: LoadedPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker claims the task score only; the validator adds the recipe's format part
    (carried by the lease) from the environment's own format rule, per completion."""
    env = type(load_env("reverse"))

    def rule(self: object, task: object, turns: list[str]) -> float:
        return float(turns[-1][:1] < "m")

    monkeypatch.setattr(env, "format_score", rule)
    weighed = honest.model_copy(
        update={"lease": honest.lease.model_copy(update={"format_reward": 0.25})}
    )
    out = run_all(weighed, policy)
    tok = policy.lm.tokenizer
    for c, claimed in zip(out, honest.submission.completions, strict=True):
        text = tok.decode(c.token_ids, skip_special_tokens=True)
        assert c.task_reward == claimed.claimed_reward
        assert c.format_reward == pytest.approx(0.25 * (text[:1] < "m"))
        assert c.reward == pytest.approx(c.task_reward + c.format_reward)
    assert len({c.format_reward for c in out}) == 2  # the rule bit on some completions
    assert all(c.format_reward == 0.0 for c in run_all(honest, policy))  # weight 0: off
