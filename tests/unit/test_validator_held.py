"""Held suspects against real Redis and real work of a real (tiny) model: a validator that cannot
recompute on the worker's declared device class holds a suspect (no slash, no training), and a
validator of that class settles it from `rollouts:held`: slashing a cheat, paying honest work."""

from __future__ import annotations

import copy
import json
import time

import pytest
import redis
import torch
from lease_answers import answer_lease
from validator_loop import validator

from prime_swarm.libs.environments import load_env
from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.hf_backend import HFBackend
from prime_swarm.libs.model.tokenizer import build_tokenizer
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.rollout import calibration
from prime_swarm.libs.rollout.calibration import Band
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import (
    Lease,
    PolicyAnnouncement,
    SamplingParams,
    SubmittedRollout,
    Verdict,
)

WORKER = "0x" + "ab" * 20
GPU = "cuda-sm90"

pytestmark = pytest.mark.usefixtures("inference")


@pytest.fixture(scope="module")
def policy() -> LoadedPolicy:
    return LoadedPolicy(0, "cd" * 32, CausalLM(init_tiny_model(1), build_tokenizer()))


def lease(n: int) -> Lease:
    task_id = f"reverse/train/{n}"
    return Lease(
        lease_id=f"lease-{n}",
        worker=WORKER,
        pool_id=1,
        work_id=n,
        env="reverse",
        task_id=task_id,
        prompt=load_env("reverse").task_from_id(task_id).prompt,
        group_size=4,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=8),
        seed=1000 + n,
        min_policy_version=0,
        expires_at=time.time() + 3600,
    )


def work(
    policy: LoadedPolicy,
    n: int,
    cheat: bool,
    device_class: str,
    weights: LoadedPolicy | None = None,
) -> SubmittedRollout:
    """An answer to lease n, declared from `device_class`; a cheat samples with another seed,
    or (`weights`) generates and proves with other weights."""
    leased = lease(n)
    sampled = leased.model_copy(update={"seed": leased.seed + 1}) if cheat else leased
    sub = answer_lease(weights or policy, sampled, HFBackend("bf16"))
    sub = sub.model_copy(update={"device_class": device_class})
    return SubmittedRollout(submission_id=f"s-{n}", lease=leased, submission=sub)


def verdicts(r: redis.Redis) -> list[Verdict]:
    return [streams.decode(Verdict, f) for _, f in r.xrange(streams.ROLLOUTS_REJECTED)]


def chain_actions(r: redis.Redis) -> list[str]:
    return [a.decode() for a in r.lrange("validator:1:chain_queue", 0, -1)]


def test_a_suspect_from_another_device_class_is_held_then_settled_by_that_class(
    redis_client: redis.Redis, policy: LoadedPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    announce = PolicyAnnouncement(version=0, step=0, model_hash="h", manifest_path="v0/m")
    redis_client.xadd(streams.POLICY_ANNOUNCEMENTS, streams.encode(announce))
    # Wide suspect bands: the seed cheat is a suspect, not a clear reject, so that what the
    # second opinion may do is what decides.
    wide = calibration.ACCEPTANCE.model_copy(
        update={"replay_z": Band(accept_at_most=10.0, reject_from=1e9), "max_replay_gap": 1e9}
    )
    monkeypatch.setattr(calibration, "ACCEPTANCE", wide)
    cheat, honest = work(policy, 1, True, GPU), work(policy, 2, False, GPU)
    for msg in (cheat, honest):
        redis_client.xadd(streams.ROLLOUTS_SUBMITTED, streams.encode(msg))

    cpu = validator(redis_client, policy, "cpu-x86_64")
    cpu.validate_batch(cpu.reader.read(10, block_ms=100))
    # The honest group is accepted at once; the cheat's second opinion fails on the CPU, which
    # is not the class it declared: held, not slashed, not trained on.
    (held,) = verdicts(redis_client)
    assert held.submission_id == cheat.submission_id and held.reason == "held_for_recheck"
    assert GPU in held.detail
    assert redis_client.xlen(streams.ROLLOUTS_VERIFIED) == 1
    assert not any('"slash"' in a for a in chain_actions(redis_client))
    assert redis_client.xlen(streams.ROLLOUTS_HELD) == 1

    # Another CPU validator passes over it: not its class to settle.
    other = validator(redis_client, policy, "cpu-x86_64")
    other.validate_batch(other.held_reader.read(10, block_ms=None), held=True)
    assert len(verdicts(redis_client)) == 1

    # A validator of the declared class recomputes the way the worker claims it did: the
    # second opinion fails on the worker's own class, and only now is it slashed.
    gpu = validator(redis_client, policy, GPU)
    gpu.validate_batch(gpu.held_reader.read(10, block_ms=None), held=True)
    final = verdicts(redis_client)[-1]
    assert final.submission_id == cheat.submission_id and final.reason == "sampling_mismatch"
    assert sum('"slash"' in a for a in chain_actions(redis_client)) == 1
    for reader in (gpu.held_reader, other.held_reader, cpu.reader):
        assert redis_client.xpending(reader.stream, reader.group)["pending"] == 0


def test_honest_held_work_is_paid_in_full_when_its_class_clears_it(
    redis_client: redis.Redis, policy: LoadedPolicy
) -> None:
    # Held before (by a validator of another class), and stale by now: settling it still
    # attests every unit, and hands it to the trainer, whose own staleness rule decides.
    announce = PolicyAnnouncement(version=9, step=9, model_hash="h", manifest_path="v9/m")
    redis_client.xadd(streams.POLICY_ANNOUNCEMENTS, streams.encode(announce))
    honest = work(policy, 3, False, GPU)
    redis_client.xadd(streams.ROLLOUTS_HELD, streams.encode(honest))
    gpu = validator(redis_client, policy, GPU)
    gpu.validate_batch(gpu.held_reader.read(10, block_ms=None), held=True)
    assert redis_client.xlen(streams.ROLLOUTS_VERIFIED) == 1
    (attest,) = map(json.loads, chain_actions(redis_client))
    units = sum(len(c.token_ids) for c in honest.submission.completions)
    assert attest["kind"] == "attest" and attest["units"] == units


def neighbour(policy: LoadedPolicy, rel: float) -> LoadedPolicy:
    """`policy` with every weight matrix moved by Gaussian noise of `rel` x its RMS: cheaper
    work that only a recomputation in the worker's own arithmetic tells apart."""
    module = copy.deepcopy(policy.lm.module)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim >= 2:
                p.add_(rel * p.float().pow(2).mean().sqrt() * torch.randn(p.shape, generator=gen))
    return LoadedPolicy(
        policy.version, policy.model_hash, CausalLM(module.eval(), policy.lm.tokenizer)
    )


def test_work_accepted_from_another_class_is_spot_checked_by_that_class(
    redis_client: redis.Redis, policy: LoadedPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that declares a class no validator here is (so that only the fp32 weight
    ratio judges it) passes a 1 %-RMS neighbour off as the policy. The CPU validator's ratio
    band is widened to let it through, as int8 gets through on shallow models; the spot check
    by a validator of the declared class slashes it. Honest work passes the same spot check
    and is attested once."""
    announce = PolicyAnnouncement(version=0, step=0, model_hash="h", manifest_path="v0/m")
    redis_client.xadd(streams.POLICY_ANNOUNCEMENTS, streams.encode(announce))
    liar = work(policy, 5, False, GPU, weights=neighbour(policy, 0.01))
    honest = work(policy, 6, False, GPU)
    for msg in (liar, honest):
        redis_client.xadd(streams.ROLLOUTS_SUBMITTED, streams.encode(msg))
    real = calibration.ACCEPTANCE
    blind = real.model_copy(update={"weight_ratio": Band(accept_at_most=1e9, reject_from=1e10)})
    monkeypatch.setattr(calibration, "ACCEPTANCE", blind)
    cpu = validator(redis_client, policy, "cpu-x86_64", audit_fraction=1.0)
    cpu.validate_batch(cpu.reader.read(10, block_ms=100))
    assert redis_client.xlen(streams.ROLLOUTS_VERIFIED) == 2 and not verdicts(redis_client)
    audits = [
        streams.decode(SubmittedRollout, f) for _, f in redis_client.xrange(streams.ROLLOUTS_HELD)
    ]
    assert [a.audit for a in audits] == [True, True]
    assert all(json.loads(a)["kind"] == "attest" for a in chain_actions(redis_client))

    monkeypatch.setattr(calibration, "ACCEPTANCE", real)
    gpu = validator(redis_client, policy, GPU, audit_fraction=1.0)
    gpu.validate_batch(gpu.held_reader.read(10, block_ms=None), held=True)
    (failed,) = verdicts(redis_client)
    assert failed.submission_id == liar.submission_id and not failed.accepted
    actions = [json.loads(a) for a in chain_actions(redis_client)]
    assert [a["kind"] for a in actions] == ["attest", "attest", "slash"]
    # Nothing is attested twice, and an audit is never queued again.
    assert redis_client.xlen(streams.ROLLOUTS_VERIFIED) == 2
    assert redis_client.xlen(streams.ROLLOUTS_HELD) == 2
    assert redis_client.xpending(gpu.held_reader.stream, gpu.held_reader.group)["pending"] == 0


def test_same_class_work_is_never_audited(redis_client: redis.Redis, policy: LoadedPolicy) -> None:
    announce = PolicyAnnouncement(version=0, step=0, model_hash="h", manifest_path="v0/m")
    redis_client.xadd(streams.POLICY_ANNOUNCEMENTS, streams.encode(announce))
    redis_client.xadd(streams.ROLLOUTS_SUBMITTED, streams.encode(work(policy, 7, False, GPU)))
    gpu = validator(redis_client, policy, GPU, audit_fraction=1.0)
    gpu.validate_batch(gpu.reader.read(10, block_ms=100))
    assert redis_client.xlen(streams.ROLLOUTS_VERIFIED) == 1
    assert redis_client.xlen(streams.ROLLOUTS_HELD) == 0
