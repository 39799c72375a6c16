"""Three outcomes, and no slash on one opinion: the bands, how a suspect is settled, and the
second opinion itself on real generations of a real (tiny, untrained) model."""

from __future__ import annotations

import math
import time

import pytest
from pydantic import ValidationError

from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.hardware import device_class
from prime_swarm.libs.model.hf_backend import HFBackend
from prime_swarm.libs.model.tokenizer import build_tokenizer
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.rl.envs import get_env
from prime_swarm.libs.rollout import calibration
from prime_swarm.libs.rollout.admission import Refusal
from prime_swarm.libs.rollout.answer import answer_lease
from prime_swarm.libs.rollout.calibration import Band
from prime_swarm.libs.rollout.noise import gumbel_noise
from prime_swarm.libs.rollout.verify import Judgement, Work, settle, verify_batch
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


@pytest.fixture(scope="module")
def honest(policy: LoadedPolicy) -> SubmittedRollout:
    task_id = "reverse/train/7"
    lease = Lease(
        lease_id="lease-7",
        worker="0x" + "ab" * 20,
        pool_id=1,
        work_id=0,
        env="reverse",
        task_id=task_id,
        prompt=get_env("reverse").task_from_id(task_id).prompt,
        group_size=4,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=8),
        seed=99,
        min_policy_version=1,
        expires_at=time.time() + 3600,
    )
    sub = answer_lease(policy, lease, HFBackend("bf16"))
    assert sub.device_class == HERE
    return SubmittedRollout(submission_id="s7", lease=lease, submission=sub)


@pytest.fixture
def suspicious(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bands so narrow that any honest noise at all makes a suspect (the second opinion's own
    limits unchanged), to drive the suspect path with real work."""
    tight = calibration.ACCEPTANCE.model_copy(
        update={
            "weight_ratio": Band(accept_at_most=0.0, reject_from=50.0),
            "replay_gap": Band(accept_at_most=0.0, reject_from=50.0),
        }
    )
    monkeypatch.setattr(calibration, "ACCEPTANCE", tight)


def tampered(policy: LoadedPolicy, entry: SubmittedRollout) -> SubmittedRollout:
    """Completion 0's first token replaced by the one the seeded noise disfavours most, with a
    proof rebuilt for it: right weights, wrong sampling."""
    sub = entry.submission
    tokens = list(sub.completions[0].token_ids)
    tokens[0] = int(gumbel_noise(entry.lease.seed, 0, 0, 256).argmin())
    from prime_swarm.libs.rollout.recompute import prefill_hidden

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
    (j,) = verify_batch([Work(honest, policy)])
    assert j.outcome == "suspect" and j.rechecked and j.second_opinion is None
    # Cleared: accepted with every completion, and no reward lost for having been held.
    assert settle(j, same_device_class=True) == "accept"
    assert len(j.completions) == 4


def test_a_cheating_suspect_is_slashed_only_by_its_own_device_class(
    honest: SubmittedRollout, policy: LoadedPolicy, suspicious: None
) -> None:
    (j,) = verify_batch([Work(tampered(policy, honest), policy)])
    assert j.outcome == "suspect" and j.second_opinion is not None
    assert j.second_opinion.reason == "sampling_mismatch"
    assert "decode" in j.second_opinion.detail
    assert settle(j, same_device_class=True) == "reject"
    # Declared another class than the validator's: the recheck cannot slash it; it is held.
    assert settle(j, same_device_class=False) == "held"


def test_without_recheck_a_suspect_is_held(
    honest: SubmittedRollout, policy: LoadedPolicy, suspicious: None
) -> None:
    (j,) = verify_batch([Work(honest, policy)], recheck=False)
    assert j.outcome == "suspect" and not j.rechecked
    assert settle(j, same_device_class=True) == "held"


def test_at_real_limits_the_tampered_token_is_rejected_outright(
    honest: SubmittedRollout, policy: LoadedPolicy
) -> None:
    (ok,) = verify_batch([Work(honest, policy)])
    assert ok.outcome == "accept", ok.refusal
    assert ok.evidence is not None and 0.5 < ok.evidence.weight_ratio < 1.5
    (bad,) = verify_batch([Work(tampered(policy, honest), policy)])
    assert bad.outcome == "reject" and bad.refusal is not None
    assert bad.refusal.reason == "sampling_mismatch" and "token 0" in bad.refusal.detail
