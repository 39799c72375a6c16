"""The worker-facing API. Every route is signed; the signer must be the worker named in the body
(services/orchestrator/deps.py checks the caller before a route runs)."""

from __future__ import annotations

import hashlib
import logging

from fastapi import APIRouter, HTTPException

from prime_swarm.libs.rollout.admission import (
    Refusal,
    check_admission,
    check_version,
    fair_share,
)
from prime_swarm.libs.rollout.calibration import acceptance_for
from prime_swarm.libs.rollout.stacks import stack_refusal
from prime_swarm.protocol.messages import (
    Heartbeat,
    HeartbeatReply,
    LeaseReply,
    LeaseRequest,
    PoolEnvironment,
    RegisterReply,
    RegisterRequest,
    RolloutSubmission,
    SubmissionBatch,
    SubmitBatchReply,
    SubmitReply,
    SubmitResult,
    SubmittedRollout,
)

from . import metrics
from .deps import (
    Caller,
    Pool,
    PoolDep,
    RegisteredWorker,
    RouteName,
    StandingWorker,
    refuse,
    require_standing,
)
from .state import Admission

log = logging.getLogger("orchestrator")
router = APIRouter(prefix="/v1")
# A stale policy is the clock's fault as often as the worker's: 409 tells it to refetch.
REFUSAL_STATUS = {"stale_policy": 409}
# A submission in on the primary but not on its replica: the whole request is answered 503.
NOT_REPLICATED = "not_replicated"


@router.post("/register", response_model=RegisterReply, name="registration")
async def register(
    body: RegisterRequest, worker: Caller, pool: PoolDep, route: RouteName
) -> RegisterReply:
    if acceptance_for(body.backend) is None:
        raise refuse(
            route,
            422,
            f"this pool has no calibrated proof limits for backend {body.backend!r}",
            "unsupported_backend",
        )
    if body.stack is not None and (why := stack_refusal(body.stack, pool.requirements)):
        raise refuse(route, 422, why, "unsupported_stack")
    pool.standing.forget(worker)  # a worker registering has often just staked
    await require_standing(route, pool, worker)
    metrics.WORKERS_SEEN.set(
        await pool.workers.register(worker, body.hardware, body.backend, body.device)
    )
    log.info("worker registered", extra={"fields": {"worker": worker}})
    return RegisterReply(
        worker=worker,
        pool_id=body.pool_id,
        heartbeat_interval_s=pool.settings.heartbeat_interval_s,
        policy=await pool.policy.info(),
        environments=[
            PoolEnvironment(env=x.env, env_args=x.args, weight=x.weight)
            for x in pool.settings.recipe.shares()
        ],
        tool_python=pool.requirements.tool_python,
    )


@router.post("/heartbeat", response_model=HeartbeatReply)
async def heartbeat(body: Heartbeat, worker: RegisteredWorker, pool: PoolDep) -> HeartbeatReply:
    # `body` says nothing beyond its caller; declared so that it is validated all the same.
    await pool.workers.seen(worker)
    ann = await pool.policy.latest()
    if ann is not None:
        metrics.POLICY_VERSION.set(ann.version)
    return HeartbeatReply(policy=await pool.policy.info())


@router.post("/lease", response_model=LeaseReply)
async def lease(
    body: LeaseRequest, worker: StandingWorker, pool: PoolDep, route: RouteName
) -> LeaseReply:
    info = await pool.policy.info()
    if info is None:
        return LeaseReply(retry_after_s=1.0)
    try:
        check_version(body.policy_version, info.version, pool.settings.recipe.async_level)
    except Refusal as exc:
        status = REFUSAL_STATUS.get(exc.reason, 422)
        raise refuse(route, status, f"{exc.detail}; fetch v{info.version}", exc.reason) from exc
    settings = pool.settings
    if await pool.leases.open_count(worker) >= settings.max_open_leases_per_worker:
        raise refuse(
            route, 429, "too many open leases; submit or let them expire", "too_many_leases"
        )
    live = await pool.workers.seen_and_live(worker)
    cap = min(
        settings.max_open_leases_per_worker,
        fair_share(settings.max_in_flight_groups, live, settings.lease_spread),
    )
    issued, in_flight = await pool.leases.issue(
        worker, settings.pool_id, info.min_version, body.count, cap
    )
    metrics.IN_FLIGHT.set(in_flight + len(issued))
    if not issued:  # enough work in flight: the trainer would only see it stale
        return LeaseReply(policy=info, retry_after_s=0.05)
    metrics.LEASES_ISSUED.inc(len(issued))
    return LeaseReply(leases=issued, policy=info)


@router.post("/submit", response_model=SubmitReply)
async def submit(
    body: RolloutSubmission, worker: StandingWorker, pool: PoolDep, route: RouteName
) -> SubmitReply:
    return SubmitReply(submission_id=await admit(route, body, pool))


@router.post("/submit/batch", response_model=SubmitBatchReply, name="submit_batch")
async def submit_batch(
    body: SubmissionBatch, worker: StandingWorker, pool: PoolDep, route: RouteName
) -> SubmitBatchReply:
    """Each submission is admitted or refused on its own, exactly as `/v1/submit` would."""
    results = []
    for sub in body.submissions:
        try:
            if sub.worker != worker or sub.pool_id != body.pool_id:
                raise refuse(route, 403, "a batch carries its signer's own work only", "foreign")
            sid = await admit(route, sub, pool)
            results.append(SubmitResult(lease_id=sub.lease_id, status=200, submission_id=sid))
        except HTTPException as exc:
            detail = exc.detail if isinstance(exc.detail, dict) else {}
            if detail.get("reason") == NOT_REPLICATED:
                raise  # the worker retries the batch; what is in already answers as before
            results.append(
                SubmitResult(
                    lease_id=sub.lease_id,
                    status=exc.status_code,
                    reason=detail.get("reason"),
                    message=str(detail.get("message", ""))[:300],
                )
            )
    return SubmitBatchReply(results=results)


async def admit(route: str, body: RolloutSubmission, pool: Pool) -> str:
    """Admit one submission of an identified, registered worker in good standing to the
    validation stream; refusals raise (HTTPException with the reason)."""
    lease = await pool.leases.get(body.lease_id)
    if lease is None:
        raise refuse(route, 404, f"unknown or expired lease {body.lease_id}", "unknown_lease")
    if lease.worker != body.worker:
        raise refuse(route, 403, "this lease was issued to another worker", "foreign_lease")
    if acceptance_for(body.backend) is None:
        raise refuse(route, 422, f"backend {body.backend!r} is not calibrated", "malformed")
    info = await pool.policy.info()
    try:
        check_admission(body, lease, info.version if info else -1, pool.settings.recipe.async_level)
    except Refusal as exc:
        await pool.leases.close(lease)  # refused work frees its slot at once, not at expiry
        raise refuse(route, REFUSAL_STATUS.get(exc.reason, 422), exc.detail, exc.reason) from exc
    submission_id = hashlib.sha256(f"{body.lease_id}:{body.content_hash()}".encode()).hexdigest()[
        :32
    ]
    entry = SubmittedRollout(submission_id=submission_id, lease=lease, submission=body)
    admitted, replication = await pool.leases.admit(entry)
    if admitted == Admission.EXPIRED:
        raise refuse(route, 410, "the lease expired before submission", "lease_expired")
    if admitted == Admission.DUPLICATE:
        raise refuse(route, 409, "this lease was already answered", "duplicate")
    if replication is not None and not replication.acknowledged:
        # In on this node, not yet on a replica (or this node is a deposed primary): a
        # failover would lose it, so the worker keeps it and retries (the retry is this
        # submission again: ADMITTED_BEFORE where it landed, ADMITTED where it did not).
        raise refuse(
            route,
            503,
            "not yet replicated; retry",
            NOT_REPLICATED,
            headers={"Retry-After": "1"},
        )
    if admitted == Admission.ADMITTED:
        metrics.SUBMISSIONS.inc()
    return submission_id
