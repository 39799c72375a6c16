"""The validator counts each worker's verdicts in the transaction that records them
(services/validator/loop.py `_commit`), where the orchestrator's status API reads them."""

from __future__ import annotations

import time
from collections import defaultdict
from types import SimpleNamespace

import redis

from prime_swarm.protocol import streams
from prime_swarm.protocol import worker_stats as ws
from prime_swarm.protocol.messages import (
    CompletionSample,
    Lease,
    RolloutSubmission,
    SamplingParams,
    SubmittedRollout,
    Verdict,
    VerifiedCompletion,
    VerifiedRollout,
)
from prime_swarm.services.validator.loop import Validator

WORKER = "0x" + "AB" * 20


def submitted(n: int) -> SubmittedRollout:
    lease = Lease(
        lease_id=f"lease-{n}",
        worker=WORKER,
        pool_id=1,
        work_id=n,
        env="reverse",
        task_id="reverse/train/1",
        prompt="p",
        group_size=1,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=8),
        seed=n,
        min_policy_version=0,
        expires_at=time.time() + 60,
    )
    sub = RolloutSubmission(
        lease_id=lease.lease_id,
        worker=WORKER,
        pool_id=1,
        task_id=lease.task_id,
        policy_version=0,
        prompt_token_ids=[1],
        completions=[CompletionSample(token_ids=[2, 3, 4], finish_reason="eos", proof=b"p")],
    )
    return SubmittedRollout(submission_id=f"s-{n}", lease=lease, submission=sub)


def verdict(msg: SubmittedRollout, reason: str | None) -> Verdict:
    return Verdict(
        submission_id=msg.submission_id,
        lease_id=msg.lease.lease_id,
        worker=WORKER,
        pool_id=1,
        accepted=reason is None,
        reason=reason,
        units=3 if reason is None else 0,
        validator="0x" + "22" * 20,
    )


def test_commit_counts_accepted_units_and_rejections_by_reason(
    redis_client: redis.Redis,
) -> None:
    validator = Validator.__new__(Validator)  # only what `_commit` touches: no chain, no model
    validator.r = redis_client
    validator.queue = SimpleNamespace(key="validator:1:chain_queue")
    validator.counts = defaultdict(int)
    batch = []
    for n, reason in enumerate((None, None, "bad_proof", "stale_policy", "bad_proof")):
        msg = submitted(n)
        v = verdict(msg, reason)
        verified = None
        if reason is None:
            done = VerifiedCompletion(token_ids=[2, 3, 4], logprobs=[0.0] * 3, reward=1.0,
                                      task_reward=1.0)  # fmt: skip
            verified = VerifiedRollout(
                submission_id=msg.submission_id,
                worker=WORKER,
                task_id=msg.submission.task_id,
                policy_version=0,
                sampling=msg.lease.sampling,
                prompt_token_ids=[1],
                completions=[done],
                verdict=v,
            )
        batch.append((f"0-{n + 1}", msg, v, verified))
    started = ws.minute(time.time())
    validator._commit(batch, [])

    totals = redis_client.hgetall(ws.VALIDATOR_WORKER.format(worker=WORKER.lower()))
    assert totals == {
        b"accepted": b"2",
        b"units": b"6",
        b"rejected:bad_proof": b"2",
        b"rejected:stale_policy": b"1",
    }
    # This minute's bucket (or the last one's, if a minute turned during the commit).
    buckets = {
        ws.VALIDATOR_ACCEPTED_PER_MINUTE.format(minute=m) for m in (started, ws.minute(time.time()))
    }
    assert sum(int(redis_client.hget(b, WORKER.lower()) or 0) for b in buckets) == 2
    assert all(redis_client.ttl(b) <= ws.BUCKET_TTL_S for b in buckets)
    assert 0 < redis_client.ttl(ws.VALIDATOR_WORKER.format(worker=WORKER.lower()))
    assert redis_client.xlen(streams.ROLLOUTS_VERIFIED) == 2
    assert redis_client.xlen(streams.ROLLOUTS_REJECTED) == 3
