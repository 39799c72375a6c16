"""A lease answered the way a worker answers it (services/worker/runner.py): its episodes played
and proven through libs/rollout/answer.py's `start_lease`, for tests that need an honest
submission to verify or to tamper with."""

from __future__ import annotations

from prime_swarm.libs.model.backend import GenerationBackend
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.rollout.answer import ProofBuilder, start_lease
from prime_swarm.protocol.messages import Lease, RolloutSubmission


def answer_lease(
    policy: LoadedPolicy, lease: Lease, backend: GenerationBackend
) -> RolloutSubmission:
    """Generate and prove one lease, waiting for the proofs."""
    builder = ProofBuilder()
    try:
        return start_lease(policy, lease, backend, builder).result()
    finally:
        builder.close()
