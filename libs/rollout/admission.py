"""The one admission rule: does a submission answer its lease, with a policy still admitted?

The orchestrator applies it at intake, the validator again when it dequeues (time has passed),
the trainer's staleness drop and the lease's minimum version come from the same function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prime_swarm.protocol.messages import Lease, RejectReason, RolloutSubmission


@dataclass
class Refusal(Exception):
    """A submission that must not go further, with the reason every service reports."""

    reason: RejectReason
    detail: str


def oldest_admitted(current_version: int, async_level: int, lease_min: int = 0) -> int:
    """Oldest policy version whose rollouts are admitted while `current_version` is the newest:
    bounded staleness (DESIGN.md §3.4), and never older than the lease asked for."""
    return max(0, current_version - async_level, lease_min)


def is_fresh(version: int, current_version: int, async_level: int) -> bool:
    return version >= oldest_admitted(current_version, async_level)


def check_version(version: int, current_version: int, async_level: int, lease_min: int = 0) -> None:
    if version > current_version:
        raise Refusal(
            "unknown_policy", f"v{version} was never announced (latest v{current_version})"
        )
    oldest = oldest_admitted(current_version, async_level, lease_min)
    if version < oldest:
        raise Refusal("stale_policy", f"v{version} is older than the oldest admitted v{oldest}")


def check_answers_lease(sub: RolloutSubmission, lease: Lease) -> None:
    """The submission is this worker's answer to this lease, shaped as the lease asked."""
    if sub.lease_id != lease.lease_id or sub.worker != lease.worker:
        raise Refusal("lease_mismatch", "submission is not for this lease or this worker")
    if sub.task_id != lease.task_id or sub.pool_id != lease.pool_id:
        raise Refusal("lease_mismatch", "task or pool differ from the lease")
    if len(sub.completions) != lease.group_size:
        raise Refusal(
            "lease_mismatch",
            f"{len(sub.completions)} completions for group size {lease.group_size}",
        )
    for i, c in enumerate(sub.completions):
        if not c.token_ids:
            raise Refusal("bad_termination", f"completion {i} is empty")
        if any(end - start > lease.sampling.max_new_tokens for start, end in c.sampled_spans):
            raise Refusal("bad_termination", f"a turn of completion {i} exceeds max_new_tokens")


def check_admission(
    sub: RolloutSubmission, lease: Lease, current_version: int, async_level: int
) -> None:
    """Everything decidable without the model: lease match, then staleness."""
    check_answers_lease(sub, lease)
    check_version(sub.policy_version, current_version, async_level, lease.min_policy_version)


def fair_share(max_in_flight: int, live_workers: int, spread: float) -> int:
    """Open leases one worker may hold: `spread` times its even part of the in-flight budget.

    Without it the first worker to ask after a new version takes the whole budget, and the
    others idle, generating nothing, until it is spent - the pool runs at one worker's speed.
    The grant itself is decided in Redis (services/orchestrator/state.py `_RESERVE_LEASES`),
    atomically, so that orchestrator replicas share one budget.
    """
    return max(1, math.ceil(spread * max_in_flight / max(1, live_workers)))
