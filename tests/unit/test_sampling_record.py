"""A worker whose sampling sits near the edge of its engine's replay band group after group is
slashed once its record is implausible at its peers' rate (libs/rollout/sampling_record.py);
an honest worker whose engine rounds that way now and then is not. The rule on made-up records,
then the validator's loop on real work of a real (tiny) model with real Redis: the record counted
at commit, read back by the next batch, and the slash queued."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import redis
from lease_answers import answer_lease
from validator_loop import CHAIN_QUEUE, HERE, validator

from prime_swarm.libs.environments import load_env
from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.hf_backend import HFBackend
from prime_swarm.libs.model.tokenizer import build_tokenizer
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.rollout import sampling_record
from prime_swarm.libs.rollout.pool_rates import Record
from prime_swarm.libs.rollout.verify import Decision, Judgement
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import (
    Lease,
    PolicyAnnouncement,
    SamplingParams,
    SubmittedRollout,
    Verdict,
)
from prime_swarm.protocol.sampling_records import SAMPLING_GROUPS, SAMPLING_MARKED, sampling_kind

COLD = "0x" + "c0" * 20
PEERS = {"0x" + c * 40: 400 for c in "123"}


def accepted(z: float) -> Decision:
    evidence = SimpleNamespace(max_replay_z=z)  # only the statistic the rule reads
    return Decision("accept", None, Judgement("accept", evidence))  # type: ignore[arg-type]


def test_an_unmarked_group_is_never_weighed() -> None:
    d = accepted(sampling_record.MARGINAL_Z)
    assert not sampling_record.marked(d)
    assert sampling_record.weigh(d, Record({COLD: 100}, {COLD: 100}), COLD) is d


def test_a_cold_worker_is_slashed_after_a_few_marked_groups_at_the_prior_rate() -> None:
    d = accepted(14.8)  # the weakest cold group of the probe
    actions = [
        sampling_record.weigh(d, Record({COLD: n}, {COLD: n}), COLD).action for n in range(1, 9)
    ]
    # Paid for its first few while the prior could explain them, slashed from then on.
    first = actions.index("reject")
    assert 2 <= first <= 6 and set(actions[first:]) == {"reject"}
    why = sampling_record.weigh(d, Record({COLD: 8}, {COLD: 8}), COLD).refusal
    assert why is not None and why.reason == "sampling_mismatch"
    assert "8 of this worker's 8" in why.detail and "prior rate" in why.detail


def test_an_honest_worker_marked_now_and_then_is_not_slashed() -> None:
    d = accepted(16.0)  # vLLM's worst honest multi-turn group
    # At the prior: one marked group in 20, or 3 in 100.
    for n, k in ((20, 1), (100, 3), (1, 1)):
        assert sampling_record.weigh(d, Record({COLD: n}, {COLD: k}), COLD).action == "accept"
    # Peers that round the same way now and then set the rate: 10 % of theirs are marked.
    peers = Record({COLD: 50, **PEERS}, {COLD: 9, **{w: 40 for w in PEERS}})
    assert sampling_record.weigh(d, peers, COLD).action == "accept"


def test_peers_who_are_never_marked_catch_a_cold_worker_sooner() -> None:
    d = accepted(12.0)
    assert sampling_record.weigh(d, Record({COLD: 3}, {COLD: 3}), COLD).action == "accept"
    witnessed = Record({COLD: 3, **PEERS}, {COLD: 3})
    assert sampling_record.weigh(d, witnessed, COLD).action == "reject"


@pytest.mark.usefixtures("inference")
def test_the_validator_counts_the_record_and_slashes_the_worker_it_convicts(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = LoadedPolicy(0, "cd" * 32, CausalLM(init_tiny_model(1), build_tokenizer()))
    announce = PolicyAnnouncement(version=0, step=0, model_hash="h", manifest_path="v0/m")
    redis_client.xadd(streams.POLICY_ANNOUNCEMENTS, streams.encode(announce))
    entries = []
    for n in range(6):
        task_id = f"reverse/train/{n}"
        lease = Lease(
            lease_id=f"lease-{n}",
            worker=COLD,
            pool_id=1,
            work_id=n,
            env="reverse",
            task_id=task_id,
            prompt=load_env("reverse").task_from_id(task_id).prompt,
            group_size=2,
            sampling=SamplingParams(temperature=1.0, max_new_tokens=6),
            seed=300 + n,
            min_policy_version=0,
            expires_at=time.time() + 3600,
        )
        sub = answer_lease(policy, lease, HFBackend("bf16"))
        entries.append(SubmittedRollout(submission_id=f"s-{n}", lease=lease, submission=sub))
    # Real honest groups, each marked as a cold worker's would be: the mark's threshold below
    # every group's z, so that the loop's own path (record read, weighed, counted) is what runs.
    monkeypatch.setattr(sampling_record, "MARGINAL_Z", -1.0)
    kind = sampling_kind(entries[0].submission.backend, HERE)
    for w, n in PEERS.items():  # three peers' clean groups, as other validators recorded them
        redis_client.hset(SAMPLING_GROUPS.format(kind=kind), w, n)
    v = validator(redis_client, policy)
    for e in entries[:2]:
        redis_client.xadd(streams.ROLLOUTS_SUBMITTED, streams.encode(e))
    v.validate_batch(v.reader.read(10, block_ms=100))
    # Each weighed as the worker's first (the record is committed with its batch): one marked
    # group at the peers' rate of 8e-4 is plausible; paid, and counted.
    assert redis_client.xlen(streams.ROLLOUTS_VERIFIED) == 2
    marks = redis_client.hget(SAMPLING_MARKED.format(kind=kind), COLD.lower())
    assert marks is not None and int(marks) == 2
    for e in entries[2:]:
        redis_client.xadd(streams.ROLLOUTS_SUBMITTED, streams.encode(e))
    v.validate_batch(v.reader.read(10, block_ms=100))
    rejected = [
        streams.decode(Verdict, f) for _, f in redis_client.xrange(streams.ROLLOUTS_REJECTED)
    ]
    assert rejected and {x.reason for x in rejected} == {"sampling_mismatch"}
    assert all("accepted groups: chance" in x.detail for x in rejected)
    # Three marked of three at that rate: chance 6e-10. Every one of them is slashed.
    assert len(rejected) == 4
    actions = [a.decode() for a in redis_client.lrange(CHAIN_QUEUE, 0, -1)]
    assert sum('"slash"' in a for a in actions) == 4 and sum('"attest"' in a for a in actions) == 2
