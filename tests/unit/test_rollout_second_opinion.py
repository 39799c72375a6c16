"""Three outcomes, and no slash on one opinion: the bands, how a suspect is settled, and the
second opinion itself on real generations of a real (tiny, untrained) model."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
from echo_env import EchoCount, registered
from lease_answers import answer_lease
from pydantic import ValidationError

from prime_swarm.libs.environments import load_env
from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.hardware import device_class
from prime_swarm.libs.model.hf_backend import HFBackend
from prime_swarm.libs.model.noise import gumbel_rows, perturbed_scores
from prime_swarm.libs.model.tokenizer import build_tokenizer
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.rollout import calibration
from prime_swarm.libs.rollout.admission import Refusal
from prime_swarm.libs.rollout.calibration import Band
from prime_swarm.libs.rollout.recompute import prefill_hidden, recompute
from prime_swarm.libs.rollout.verify import (
    Judgement,
    Work,
    decide,
    judge_group,
    settle,
    verify_batch,
)
from prime_swarm.libs.toploc import build_proof, group_contexts
from prime_swarm.protocol.messages import Lease, SamplingParams, SubmittedRollout

HERE = device_class("cpu")


def test_band_outcomes() -> None:
    band = Band(accept_at_most=1.0, reject_from=2.0)
    assert band.outcome(0.0) == band.outcome(1.0) == "accept"
    assert band.outcome(1.5) == "suspect"
    assert band.outcome(2.0) == band.outcome(math.inf) == "reject"
    assert band.outcome(math.nan) == "reject"  # no honest statistic is NaN
    with pytest.raises(ValidationError):
        Band(accept_at_most=2.0, reject_from=1.0)


@pytest.mark.parametrize(
    ("outcome", "rechecked", "second", "same_class", "settled"),
    [
        ("accept", False, None, False, "accept"),
        ("reject", False, None, False, "reject"),
        # A suspect the second opinion clears is accepted, wherever that opinion ran.
        ("suspect", True, None, False, "accept"),
        ("suspect", True, None, True, "accept"),
        # Failed twice, the second time on the worker's own device class: slashed.
        ("suspect", True, Refusal("bad_proof", "x"), True, "reject"),
        # Failed on another class (or never rechecked): held, neither trained on nor slashed.
        ("suspect", True, Refusal("bad_proof", "x"), False, "held"),
        ("suspect", False, None, True, "held"),
    ],
)
def test_settle(
    outcome: str, rechecked: bool, second: Refusal | None, same_class: bool, settled: str
) -> None:
    judgement = Judgement(outcome, rechecked=rechecked, second_opinion=second)  # type: ignore[arg-type]
    assert settle(judgement, same_class) == settled


# --------------------------------------------------------------------------- on a real model
pytestmark = pytest.mark.usefixtures("inference")


@pytest.fixture(scope="module")
def policy() -> LoadedPolicy:
    return LoadedPolicy(3, "cd" * 32, CausalLM(init_tiny_model(1), build_tokenizer()))


def answered(
    policy: LoadedPolicy, env: str, task_id: str, seed: int, max_new_tokens: int
) -> SubmittedRollout:
    """An honest group of four answered by the hf worker's own path, on this device class."""
    lease = Lease(
        lease_id=f"lease-{task_id}",
        worker="0x" + "ab" * 20,
        pool_id=1,
        work_id=seed,
        env=env,
        task_id=task_id,
        prompt=load_env(env).task_from_id(task_id).prompt,
        group_size=4,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens),
        seed=seed,
        min_policy_version=1,
        expires_at=time.time() + 3600,
    )
    sub = answer_lease(policy, lease, HFBackend("bf16"))
    assert sub.device_class == HERE
    return SubmittedRollout(submission_id=f"s-{task_id}", lease=lease, submission=sub)


@pytest.fixture(scope="module")
def honest(policy: LoadedPolicy) -> SubmittedRollout:
    return answered(policy, "reverse", "reverse/train/7", seed=99, max_new_tokens=8)


@pytest.fixture(scope="module")
def multi_turn(policy: LoadedPolicy) -> Iterator[SubmittedRollout]:
    """An honest group of multi-turn episodes: the environment's replies sit between the
    model's turns in every branch (loadable by name while the module's tests run)."""
    with registered(EchoCount()) as env:
        entry = answered(policy, env.name, "echo-count/train/0", seed=5, max_new_tokens=4)
        assert all(len(c.sampled_spans) > 1 for c in entry.submission.completions)
        yield entry


@pytest.fixture
def suspicious(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bands so narrow that any honest noise at all makes a suspect (the second opinion's own
    limits unchanged), to drive the suspect path with real work."""
    tight = calibration.ACCEPTANCE.model_copy(
        update={
            "weight_ratio": Band(accept_at_most=0.0, reject_from=50.0),
            "replay_z": Band(accept_at_most=0.0, reject_from=1e9),
            "replay_z_own_class": Band(accept_at_most=0.0, reject_from=1e9),
            "max_replay_gap": 1e9,
        }
    )
    monkeypatch.setattr(calibration, "ACCEPTANCE", tight)


def tampered(policy: LoadedPolicy, entry: SubmittedRollout) -> SubmittedRollout:
    """Completion 0's first token replaced by the one the seeded noise disfavours most, with a
    proof rebuilt for it: right weights, wrong sampling."""
    sub = entry.submission
    tokens = list(sub.completions[0].token_ids)
    tokens[0] = int(gumbel_rows([(entry.lease.seed, 0, 0)], 256)[0].argmin())
    (hidden,) = prefill_hidden(policy.lm, [(sub.prompt_token_ids, tokens)], "bf16")
    ctx = group_contexts(
        policy.model_hash,
        entry.lease.lease_id,
        [tokens, *(c.token_ids for c in sub.completions[1:])],
    )[0]
    comps = list(sub.completions)
    comps[0] = comps[0].model_copy(update={"token_ids": tokens, "proof": build_proof(hidden, ctx)})
    return entry.model_copy(update={"submission": sub.model_copy(update={"completions": comps})})


def test_an_honest_suspect_is_cleared_by_the_second_opinion(
    honest: SubmittedRollout, policy: LoadedPolicy, suspicious: None
) -> None:
    (d,) = verify_batch([Work(honest, policy)])
    j = d.judgement
    assert j.outcome == "suspect" and j.rechecked and j.second_opinion is None
    # Cleared: accepted with every completion, and no reward lost for having been held.
    assert d.action == "accept" and d.refusal is None
    assert len(d.completions) == 4


def test_an_honest_multi_turn_suspect_is_cleared_by_the_second_opinion(
    multi_turn: SubmittedRollout, policy: LoadedPolicy, suspicious: None
) -> None:
    """The recheck replays the model's turns only: the environment's replies between them were
    never sampled (they trail the seeded choice by whole logits) and are checked exactly by the
    episode replay. Judging them too failed every honest multi-turn suspect, and slashed it on
    the worker's own device class."""
    (d,) = verify_batch([Work(multi_turn, policy)], device_class=HERE)
    j = d.judgement
    assert j.outcome == "suspect" and j.rechecked
    assert j.second_opinion is None, j.second_opinion
    assert d.action == "accept"


def test_a_cheating_suspect_is_slashed_only_by_its_own_device_class(
    honest: SubmittedRollout, policy: LoadedPolicy, suspicious: None
) -> None:
    (d,) = verify_batch([Work(tampered(policy, honest), policy)])
    j = d.judgement
    assert j.outcome == "suspect" and j.second_opinion is not None
    assert j.second_opinion.reason == "sampling_mismatch"
    assert "decode" in j.second_opinion.detail
    # Rechecked on the worker's own class: rejected on the second opinion's reason, with
    # nothing for the trainer.
    own = decide(j, HERE, HERE)
    assert own.action == "reject" and own.refusal == j.second_opinion and own.completions == []
    # Declared another class than the validator's: the recheck cannot slash it; it is held.
    held = decide(j, "another", HERE)
    assert held.action == "held" and held.refusal is not None and held.completions == []
    assert held.refusal.reason == "held_for_recheck" and "another" in held.refusal.detail


def test_without_recheck_a_suspect_is_held(
    honest: SubmittedRollout, policy: LoadedPolicy, suspicious: None
) -> None:
    (d,) = verify_batch([Work(honest, policy)], recheck=False)
    assert d.judgement.outcome == "suspect" and not d.judgement.rechecked
    assert d.action == "held" and d.completions == []


def test_at_real_limits_the_tampered_token_is_rejected_outright(
    honest: SubmittedRollout, policy: LoadedPolicy
) -> None:
    (ok,) = verify_batch([Work(honest, policy)])
    assert ok.action == "accept", ok.refusal
    ev = ok.judgement.evidence
    assert ev is not None and 0.5 < ev.weight_ratio < 1.5
    (bad,) = verify_batch([Work(tampered(policy, honest), policy)])
    assert bad.action == "reject" and bad.judgement.outcome == "reject"
    assert bad.refusal is not None
    assert bad.refusal.reason == "sampling_mismatch" and "token 0" in bad.refusal.detail


def runner_up(policy: LoadedPolicy, entry: SubmittedRollout) -> tuple[SubmittedRollout, float]:
    """The cheapest-looking sampling cheat: one completion's last token swapped for the
    seeded noise's runner-up under the reference logits (a near-tie, chosen where it trails
    least), proof rebuilt; and how far it trails, in tempered logits."""
    sub, lease = entry.submission, entry.lease
    recs = recompute(policy.lm, Work(entry, policy).pairs(), "bf16")
    best: tuple[float, int, int] | None = None
    for i, (c, rec) in enumerate(zip(sub.completions, recs, strict=True)):
        k = len(c.token_ids) - 1
        logits = policy.lm.cast("fp32").head_logits(rec.reference[k : k + 1])
        scores = perturbed_scores(logits, 1.0, gumbel_rows([(lease.seed, i, k)], logits.shape[-1]))
        top = scores[0].topk(2)
        gap = float(top.values[0] - top.values[1])
        if c.finish_reason == "length" and (best is None or gap < best[0]):
            best = (gap, i, int(top.indices[1]))
    assert best is not None
    gap, i, token = best
    tokens = [*sub.completions[i].token_ids[:-1], token]
    (hidden,) = prefill_hidden(policy.lm, [(sub.prompt_token_ids, tokens)], "bf16")
    ctx = group_contexts(
        policy.model_hash,
        lease.lease_id,
        [tokens if j == i else c.token_ids for j, c in enumerate(sub.completions)],
    )[i]
    comps = list(sub.completions)
    comps[i] = comps[i].model_copy(
        update={"token_ids": tokens, "proof": build_proof(hidden, ctx), "claimed_reward": None}
    )
    return entry.model_copy(
        update={"submission": sub.model_copy(update={"completions": comps})}
    ), gap


def test_a_near_tie_that_honest_noise_cannot_flip_is_a_sampling_cheat(
    honest: SubmittedRollout, policy: LoadedPolicy
) -> None:
    """Judged in units of the noise at its position, not in logits: a token the seeded noise
    ranked second, however close, trails by far more than rounding moves it (an absolute limit
    of 1.0 let such flips through on a peaked model)."""
    limits = calibration.ACCEPTANCE
    (ok,) = verify_batch([Work(honest, policy)], device_class=HERE)
    ev = ok.judgement.evidence
    assert ev is not None and ev.max_replay_z <= limits.replay_z.accept_at_most
    cheat, gap = runner_up(policy, honest)
    (d,) = verify_batch([Work(cheat, policy)], device_class=HERE)
    ev = d.judgement.evidence
    assert ev is not None and ev.max_replay_gap == pytest.approx(gap, abs=1e-3)
    assert ev.max_replay_z > limits.replay_z.accept_at_most
    assert d.action == "reject"
    assert d.refusal is not None and d.refusal.reason == "sampling_mismatch"


def test_a_proof_over_only_the_mantissa_limits_is_a_suspect_not_a_slash(
    honest: SubmittedRollout, policy: LoadedPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exponents and signs agree, only TOPLOC's per-chunk mantissa error is over (an honest
    1-token chunk of the tiny model reached 10.47 against 10): the second opinion settles it.
    A proof of other states (exponents differ) is still rejected outright."""
    strict = calibration.ACCEPTANCE.gross.model_copy(
        update={"max_mant_err_mean": 0.0, "max_mant_err_median": 0.0}
    )
    monkeypatch.setattr(
        calibration, "ACCEPTANCE", calibration.ACCEPTANCE.model_copy(update={"gross": strict})
    )
    (d,) = verify_batch([Work(honest, policy)], device_class=HERE)
    j = d.judgement
    assert j.outcome == "suspect" and j.refusal is not None and "mantissa" in j.refusal.detail
    assert j.rechecked and j.second_opinion is None
    assert d.action == "accept"
    sub = honest.submission
    other = CausalLM(init_tiny_model(2), build_tokenizer())  # other weights' states, same tokens
    (hidden,) = prefill_hidden(other, [(sub.prompt_token_ids, sub.completions[0].token_ids)])
    ctx = group_contexts(
        policy.model_hash, honest.lease.lease_id, [c.token_ids for c in sub.completions]
    )[0]
    comps = list(sub.completions)
    comps[0] = comps[0].model_copy(update={"proof": build_proof(hidden, ctx)})
    forged = honest.model_copy(
        update={"submission": honest.submission.model_copy(update={"completions": comps})}
    )
    (bad,) = verify_batch([Work(forged, policy)], device_class=HERE)
    assert bad.action == "reject" and bad.judgement.outcome == "reject"
    assert bad.refusal is not None
    assert bad.refusal.reason == "bad_proof" and "exponent" in bad.refusal.detail


def test_a_near_tie_is_judged_by_the_band_of_who_could_have_rounded_it(
    honest: SubmittedRollout, policy: LoadedPolicy
) -> None:
    """z 8.3 (a turn sampled with another seed that differed only at a near-tie, measured by
    bench/toploc/multi_turn.py): a suspect on the validator's own class and engine, where honest
    flips stay under 6, but within the honest spread of another class or of vLLM's kernels."""
    (ok,) = verify_batch([Work(honest, policy)], device_class=HERE)
    ev = ok.judgement.evidence
    assert ev is not None and ev.same_class_err is not None
    ev.completions[0] = replace(ev.completions[0], max_replay_z=8.3, max_replay_gap=0.03)
    hf, vllm = calibration.acceptance_for("hf"), calibration.acceptance_for("vllm")
    assert hf is not None and vllm is not None
    assert judge_group(Work(honest, policy), ev, hf, 1e-6).outcome == "suspect"
    assert judge_group(Work(honest, policy), ev, vllm, 1e-6).outcome == "accept"
    other_class = replace(ev, same_class_err=None)
    assert judge_group(Work(honest, policy), other_class, hf, 1e-6).outcome == "accept"


def test_vllm_work_differs_only_in_the_sampling_replay() -> None:
    """Declaring vLLM buys the replay's spread of vLLM's kernels and nothing else."""
    hf, vllm = calibration.acceptance_for("hf"), calibration.acceptance_for("vllm")
    assert hf is not None and vllm is not None
    a, b = hf.model_dump(), vllm.model_dump()
    assert {k for k in a if a[k] != b[k]} == {"replay_z_own_class", "recheck"}
    assert {k for k in a["recheck"] if a["recheck"][k] != b["recheck"][k]} == {"max_replay_z"}
    assert b["replay_z_own_class"] is None
