"""The orchestrator as a real uvicorn process against real Redis and a real anvil chain:
signed requests, identity, on-chain membership, leases and admission."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import httpx
import pytest
import redis
from eth_account import Account

from prime_swarm.libs.chain.anvil import Anvil
from prime_swarm.libs.localnet.redis_server import RedisServer
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import (
    CompletionSample,
    RolloutSubmission,
    SubmittedRollout,
)
from prime_swarm.protocol.signing import WorkerAuth, sign_request
from prime_swarm.services.worker.client import OrchestratorClient, OrchestratorError


@pytest.fixture(scope="module")
def pool(
    anvil: Anvil,
    redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
    start_live_pool: Callable[..., AbstractContextManager[Any]],
) -> Iterator[dict]:
    with start_live_pool(anvil, redis_server.url, tmp_path_factory.mktemp("orch-logs")) as live:
        yield {
            "url": live.url,
            "pool_id": live.pool_id,
            "member": live.member,
            "outsider": live.outsider,
            "redis": live.redis,
        }


def client(pool: dict, account: object) -> OrchestratorClient:
    return OrchestratorClient(pool["url"], account, timeout_s=10, retry_budget=0)


def body(pool: dict, worker: str, **extra: object) -> dict:
    return {"worker": worker, "pool_id": pool["pool_id"], **extra}


def test_unsigned_and_forged_requests_are_401(pool: dict) -> None:
    resp = httpx.post(
        f"{pool['url']}/v1/heartbeat",
        json=body(pool, pool["member"].address),
        timeout=10,
    )
    assert resp.status_code == 401 and "missing signature" in resp.text
    payload = httpx.Request("POST", "/", json=body(pool, pool["member"].address)).content
    headers = sign_request(pool["member"], "POST", "/v1/heartbeat", "", payload)
    tampered = payload.replace(b"{", b"{ ", 1)  # the same JSON, other bytes: not what was signed
    resp = httpx.post(
        f"{pool['url']}/v1/heartbeat",
        content=tampered,
        headers={**headers, "content-type": "application/json"},
        timeout=10,
    )
    assert resp.status_code == 401 and "does not match" in resp.text


def test_replayed_request_is_refused(pool: dict) -> None:
    c = client(pool, pool["member"])
    c.register(_register(pool, pool["member"].address))
    payload = httpx.Request("POST", "/", json=body(pool, pool["member"].address)).content
    headers = {
        **sign_request(pool["member"], "POST", "/v1/heartbeat", "", payload),
        "content-type": "application/json",
    }
    first = httpx.post(f"{pool['url']}/v1/heartbeat", content=payload, headers=headers, timeout=10)
    again = httpx.post(f"{pool['url']}/v1/heartbeat", content=payload, headers=headers, timeout=10)
    assert first.status_code == 200
    assert again.status_code == 401 and "replayed nonce" in again.text


def test_acting_for_another_worker_is_403(pool: dict) -> None:
    c = client(pool, pool["outsider"])
    with pytest.raises(OrchestratorError) as err:
        c.register(_register(pool, pool["member"].address))
    assert err.value.status == 403 and err.value.reason == "foreign_signer"


def test_every_signed_route_serves_only_its_own_registered_members(pool: dict) -> None:
    """What every signed route checks of its caller, answered and counted alike whichever the
    route: the signer is the worker named (403 foreign_signer), in this pool (404 wrong_pool),
    and registered (403 not_registered)."""
    stranger = Account.create()  # signs for itself, never registered
    http = httpx.Client(base_url=pool["url"], auth=WorkerAuth(stranger), timeout=10)
    own, members = body(pool, stranger.address), body(pool, pool["member"].address)
    answer = {"lease_id": "l", "task_id": "t", "policy_version": 5, "prompt_token_ids": [1]}
    answer["completions"] = [{"token_ids": [1], "finish_reason": "eos", "proof": "cA=="}]
    cases = [
        ("/v1/heartbeat", own, 403, "not_registered"),
        ("/v1/lease", {**own, "policy_version": 5}, 403, "not_registered"),
        ("/v1/submit", {**own, **answer}, 403, "not_registered"),
        ("/v1/submit/batch", {**own, "submissions": [{**own, **answer}]}, 403, "not_registered"),
        ("/v1/heartbeat", {**own, "pool_id": pool["pool_id"] + 1}, 404, "wrong_pool"),
        ("/v1/lease", {**members, "policy_version": 5}, 403, "foreign_signer"),
        (
            "/v1/submit/batch",
            {**members, "submissions": [{**members, **answer}]},
            403,
            "foreign_signer",
        ),
    ]
    for path, sent, status, reason in cases:
        resp = http.post(path, json=sent)
        assert (resp.status_code, resp.json()["detail"]["reason"]) == (status, reason), path
    metrics = httpx.get(f"{pool['url']}/metrics", timeout=10).text
    for route in ("heartbeat", "lease", "submit", "submit_batch"):
        assert f'orchestrator_refused_total{{reason="not_registered",route="{route}"}}' in metrics


def test_registration_needs_stake_on_chain(pool: dict) -> None:
    with pytest.raises(OrchestratorError) as err:
        client(pool, pool["outsider"]).register(_register(pool, pool["outsider"].address))
    assert err.value.status == 403 and err.value.reason == "not_a_member"


def test_registered_member_gets_policy_and_leases(pool: dict) -> None:
    m = pool["member"]
    c = client(pool, m)
    reply = c.register(_register(pool, m.address))
    assert reply.policy is not None and reply.policy.version == 5
    assert reply.policy.min_version == 3
    reply = c.lease(_lease_req(pool, m.address, 5))
    assert reply.policy is not None and reply.policy.version == 5
    (lease,) = reply.leases
    assert lease.group_size == 2 and lease.min_policy_version == 3
    with pytest.raises(OrchestratorError) as err:
        c.lease(_lease_req(pool, m.address, 2))
    assert err.value.reason == "stale_policy"
    with pytest.raises(OrchestratorError) as err:
        c.lease(_lease_req(pool, m.address, 9))
    assert err.value.reason == "unknown_policy"


def test_submission_admission(pool: dict) -> None:
    m = pool["member"]
    c = client(pool, m)
    c.register(_register(pool, m.address))
    r: redis.Redis = pool["redis"]
    (lease,) = c.lease(_lease_req(pool, m.address, 4)).leases
    wrong_group = _submission(lease, m.address, n=1)
    with pytest.raises(OrchestratorError) as err:
        c.submit(wrong_group)
    assert err.value.reason == "lease_mismatch"
    before = r.xlen(streams.ROLLOUTS_SUBMITTED)
    reply = c.submit(_submission(lease, m.address))
    assert r.xlen(streams.ROLLOUTS_SUBMITTED) == before + 1
    _, fields = r.xrevrange(streams.ROLLOUTS_SUBMITTED, count=1)[0]
    entry = streams.decode(SubmittedRollout, fields)
    assert entry.submission_id == reply.submission_id and entry.lease == lease
    # The same answer again is a retry whose reply was lost: the same id, nothing added.
    assert c.submit(_submission(lease, m.address)).submission_id == reply.submission_id
    assert r.xlen(streams.ROLLOUTS_SUBMITTED) == before + 1
    first = _submission(lease, m.address)
    changed = first.completions[0].model_copy(update={"token_ids": [6, 7]})
    other = first.model_copy(update={"completions": [changed, *first.completions[1:]]})
    with pytest.raises(OrchestratorError) as err:
        c.submit(other)
    assert err.value.status == 409 and err.value.reason == "duplicate"
    with pytest.raises(OrchestratorError) as err:
        c.submit(_submission(lease.model_copy(update={"lease_id": "nope"}), m.address))
    assert err.value.status == 404


def test_leases_come_in_batches_up_to_the_worker_cap(pool: dict) -> None:
    m = pool["member"]  # registered by the tests above (registrations are rate-limited)
    c = client(pool, m)
    r: redis.Redis = pool["redis"]
    already = int(r.zcard(f"orch:open_leases:{m.address.lower()}"))
    batch = c.lease(_lease_req(pool, m.address, 5).model_copy(update={"count": 8})).leases
    # PRIME_ORCH_MAX_OPEN_LEASES_PER_WORKER=3: the batch is cut to what the worker may hold.
    assert len(batch) == 3 - already and len({x.task_id for x in batch}) == len(batch)
    with pytest.raises(OrchestratorError) as err:
        c.lease(_lease_req(pool, m.address, 5))
    assert err.value.status == 429 and err.value.reason == "too_many_leases"
    # A refused submission frees its slot at once instead of holding it until the lease expires.
    with pytest.raises(OrchestratorError) as err:
        c.submit(_submission(batch[0], m.address, n=1))
    assert err.value.reason == "lease_mismatch"
    (again,) = c.lease(_lease_req(pool, m.address, 5).model_copy(update={"count": 8})).leases
    assert again.lease_id not in {x.lease_id for x in batch}


def test_backend_outside_the_protocol_is_refused(pool: dict) -> None:
    # Both protocol engines are calibrated (libs/rollout/calibration.py); a name the protocol
    # does not know is refused at registration, never stored.
    m = pool["member"]
    c = client(pool, m)
    c.register(_register(pool, m.address).model_copy(update={"backend": "vllm"}))
    http = httpx.Client(base_url=pool["url"], auth=WorkerAuth(m), timeout=10)
    body = _register(pool, m.address).model_dump(mode="json") | {"backend": "sglang"}
    resp = http.post("/v1/register", json=body)
    assert resp.status_code == 422 and resp.json()["detail"]["reason"] == "malformed"


def test_malformed_body_is_422_with_reason(pool: dict) -> None:
    m = pool["member"]
    http = httpx.Client(base_url=pool["url"], auth=WorkerAuth(m), timeout=10)
    resp = http.post("/v1/submit", json={"worker": m.address, "completions": "nope"})
    assert resp.status_code == 422 and resp.json()["detail"]["reason"] == "malformed"


def _register(pool: dict, worker: str):  # noqa: ANN202
    from prime_swarm.protocol.messages import RegisterRequest

    return RegisterRequest(worker=worker, pool_id=pool["pool_id"])


def _lease_req(pool: dict, worker: str, version: int):  # noqa: ANN202
    from prime_swarm.protocol.messages import LeaseRequest

    return LeaseRequest(worker=worker, pool_id=pool["pool_id"], policy_version=version)


def _submission(lease, worker: str, n: int | None = None) -> RolloutSubmission:  # noqa: ANN001
    return RolloutSubmission(
        lease_id=lease.lease_id,
        worker=worker,
        pool_id=lease.pool_id,
        task_id=lease.task_id,
        policy_version=4,
        prompt_token_ids=[1, 2, 3],
        completions=[
            CompletionSample(token_ids=[4, 5], finish_reason="eos", proof=b"p")
            for _ in range(n or lease.group_size)
        ],
    )
