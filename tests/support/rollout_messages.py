"""Small, valid stream messages for tests of code that reads the rollout streams."""

from __future__ import annotations

import time

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

WORKER = "0x" + "AB" * 20


def submitted(n: int) -> SubmittedRollout:
    return submission_for(
        Lease(
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
        ),
        f"s-{n}",
    )


def submission_for(lease: Lease, submission_id: str | None = None) -> SubmittedRollout:
    """An answer to `lease` (its worker, task and pool)."""
    sub = RolloutSubmission(
        lease_id=lease.lease_id,
        worker=lease.worker,
        pool_id=lease.pool_id,
        task_id=lease.task_id,
        policy_version=0,
        prompt_token_ids=[1],
        completions=[CompletionSample(token_ids=[2, 3, 4], finish_reason="eos", proof=b"p")],
    )
    sid = submission_id or f"s-{lease.lease_id}"[:32]
    return SubmittedRollout(submission_id=sid, lease=lease, submission=sub)


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


def verified(msg: SubmittedRollout) -> VerifiedRollout:
    """The accepted form of `msg`, as a validator writes it for the trainer."""
    done = VerifiedCompletion(token_ids=[2, 3, 4], logprobs=[0.0] * 3, reward=1.0, task_reward=1.0)
    return VerifiedRollout(
        submission_id=msg.submission_id,
        worker=WORKER,
        task_id=msg.submission.task_id,
        policy_version=0,
        sampling=msg.lease.sampling,
        prompt_token_ids=[1],
        completions=[done],
        verdict=verdict(msg, None),
    )


def answer(lease: Lease, policy_version: int = 5) -> RolloutSubmission:
    """A well-formed answer to `lease` as a worker sends it (a group of fake completions)."""
    return RolloutSubmission(
        lease_id=lease.lease_id,
        worker=lease.worker,
        pool_id=lease.pool_id,
        task_id=lease.task_id,
        policy_version=policy_version,
        prompt_token_ids=[1, 2, 3],
        completions=[
            CompletionSample(token_ids=[4, 5], finish_reason="eos", proof=b"p")
            for _ in range(lease.group_size)
        ],
    )
