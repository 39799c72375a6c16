"""Attacks on a live orchestrator process, each answered with a 4xx while the process lives on.

Each test reproduces a finding of the hardening review against a real uvicorn process, real
Redis and a real ledger on anvil."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import httpx
import pytest
from eth_account import Account
from eth_account.messages import encode_defunct

from prime_swarm.libs.chain.anvil import Anvil
from prime_swarm.libs.localnet.ports import free_port
from prime_swarm.libs.localnet.redis_server import RedisServer
from prime_swarm.protocol.messages import Heartbeat, LeaseRequest, RegisterRequest
from prime_swarm.protocol.signing import (
    HEADER_ADDRESS,
    HEADER_NONCE,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    WorkerAuth,
    canonical_request,
    sign_request,
)
from prime_swarm.services.worker.cli import chain_command
from prime_swarm.services.worker.client import OrchestratorClient, OrchestratorError
from prime_swarm.services.worker.onboarding import JoinError
from prime_swarm.services.worker.settings import WorkerChainSettings

EVENTS_POLL_S = 0.2  # standings are cached for the default 300 s: only events drop them
RATES = {"heartbeat": {"per_second": 1.0, "burst": 3}}
MIN_STAKE = 10**18
FAST_CHAIN_TIMEOUT = {"PRIME_ORCH_CHAIN_TIMEOUT_S": "2"}
CHAIN_BUDGET = {"per_second": 0.5, "burst": 4}


@pytest.fixture(scope="module")
def pool(
    anvil: Anvil,
    tmp_path_factory: pytest.TempPathFactory,
    start_live_pool: Callable[..., AbstractContextManager[Any]],
) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("hardening")
    redis_server = RedisServer(root / "redis", root / "logs")
    env = {
        "PRIME_ORCH_STANDING_EVENTS_POLL_S": str(EVENTS_POLL_S),
        "PRIME_ORCH_RATE_LIMITS": json.dumps(RATES),
        "PRIME_ORCH_CHAIN_LOOKUP_RATE": json.dumps(CHAIN_BUDGET),
    }
    try:
        with start_live_pool(anvil, redis_server.url, root / "logs", env) as live:
            yield live
    finally:
        redis_server.stop()


def heartbeat(pool: Any, worker: str) -> Heartbeat:
    return Heartbeat(worker=worker, pool_id=pool.pool_id)


def alive(pool: Any) -> bool:
    return pool.process.alive() and httpx.get(f"{pool.url}/healthz", timeout=10).status_code == 200


def signed_post(pool: Any, account: Any, path: str, body: bytes, **headers: str) -> httpx.Response:
    signature = sign_request(account, "POST", path, "", body)
    return httpx.post(
        f"{pool.url}{path}",
        content=body,
        headers={"content-type": "application/json", **signature, **headers},
        timeout=30,
    )


def register(pool: Any, account: Any) -> None:
    client = OrchestratorClient(pool.url, account, timeout_s=10, retry_budget=0)
    client.register(RegisterRequest(worker=account.address, pool_id=pool.pool_id))


def refused_soon(pool: Any, account: Any) -> OrchestratorError | None:
    """The first refusal of a lease within a few event polls (None if every lease was given)."""
    deadline = time.monotonic() + 20 * EVENTS_POLL_S
    while time.monotonic() < deadline:
        refused = lease(pool, account)
        if refused is not None:
            return refused
        time.sleep(EVENTS_POLL_S / 2)
    return None


def lease(pool: Any, account: Any) -> OrchestratorError | None:
    client = OrchestratorClient(pool.url, account, timeout_s=10, retry_budget=0)
    try:
        client.lease(LeaseRequest(worker=account.address, pool_id=pool.pool_id, policy_version=5))
    except OrchestratorError as exc:
        return exc
    return None


@pytest.mark.parametrize("signed", [False, True])
def test_deeply_nested_body_is_400_not_a_crash(pool: Any, signed: bool) -> None:
    # Before the fix this killed the process with SIGSEGV (py_ecc lifts the recursion limit).
    body = b"[" * 300_000 + b"]" * 300_000
    if signed:
        resp = signed_post(pool, pool.member, "/v1/heartbeat", body)
    else:
        resp = httpx.post(
            f"{pool.url}/v1/heartbeat",
            content=body,
            headers={"content-type": "application/json"},
            timeout=30,
        )
    assert resp.status_code == 400 and "nested" in resp.json()["detail"]["message"]
    assert alive(pool)


def test_chunked_body_over_the_cap_is_413_before_it_is_read(pool: Any) -> None:
    # A raw socket, because an HTTP client sends the whole body before it reads the reply.
    host, port = pool.url.removeprefix("http://").split(":")
    offered, chunk = 64 << 20, b" " * (1 << 20)
    sent = 0
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        try:
            while sent < offered and not select.select([sock], [], [], 0)[0]:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        except OSError:
            pass  # the server closed the connection on us: it stopped reading
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    # The cap is the recipe's widest batch (4.0 MiB here); the rest is what the kernel's socket
    # buffers absorbed.
    assert sent < offered // 2, f"{sent} bytes accepted before the refusal"
    assert alive(pool)


def test_validation_errors_do_not_echo_the_input(pool: Any) -> None:
    body = json.dumps({"worker": "x" * 1_000_000, "pool_id": pool.pool_id}).encode()
    resp = signed_post(pool, pool.member, "/v1/heartbeat", body)
    assert resp.status_code == 422 and resp.json()["detail"]["reason"] == "malformed"
    assert len(resp.content) < 4096


@pytest.mark.parametrize("timestamp", ["nan", "inf", "-inf", "NaN", "1e999"])
def test_non_finite_timestamp_is_401(pool: Any, timestamp: str) -> None:
    account = pool.member
    body = heartbeat(pool, account.address).model_dump_json().encode()
    nonce = "n" + timestamp.replace("-", "m") + "0123456789"
    text = canonical_request("POST", "/v1/heartbeat", "", body, timestamp, nonce)
    sig = account.sign_message(encode_defunct(text=text)).signature.hex()
    resp = httpx.post(
        f"{pool.url}/v1/heartbeat",
        content=body,
        headers={
            "content-type": "application/json",
            HEADER_ADDRESS: account.address,
            HEADER_TIMESTAMP: timestamp,
            HEADER_NONCE: nonce,
            HEADER_SIGNATURE: "0x" + sig.removeprefix("0x"),
        },
        timeout=10,
    )
    assert resp.status_code == 401 and "finite" in resp.text


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_wrong_content_type_on_a_signed_route_is_415(pool: Any, content_type: str) -> None:
    body = heartbeat(pool, pool.member.address).model_dump_json().encode()
    resp = signed_post(pool, pool.member, "/v1/heartbeat", body, **{"content-type": content_type})
    assert resp.status_code == 415
    assert alive(pool)


def test_heartbeats_are_rate_limited_with_retry_after(pool: Any) -> None:
    account = pool.new_member()
    register(pool, account)
    http = httpx.Client(base_url=pool.url, auth=WorkerAuth(account), timeout=10)
    body = heartbeat(pool, account.address).model_dump(mode="json")
    statuses = [http.post("/v1/heartbeat", json=body) for _ in range(8)]
    codes = [r.status_code for r in statuses]
    assert codes[:3] == [200, 200, 200] and 429 in codes
    limited = next(r for r in statuses if r.status_code == 429)
    assert limited.json()["detail"]["reason"] == "rate_limited"
    assert int(limited.headers["retry-after"]) >= 1
    # Another worker's allowance is its own.
    other = httpx.Client(base_url=pool.url, auth=WorkerAuth(pool.member), timeout=10)
    register(pool, pool.member)
    other_body = heartbeat(pool, pool.member.address)
    assert other.post("/v1/heartbeat", json=other_body.model_dump(mode="json")).status_code == 200


def test_throwaway_keys_cannot_make_the_orchestrator_spend_chain_calls(pool: Any) -> None:
    time.sleep(CHAIN_BUDGET["burst"] / CHAIN_BUDGET["per_second"])  # a full budget
    reasons = []
    for _ in range(10):
        stranger = Account.create()
        try:
            register(pool, stranger)
        except OrchestratorError as exc:
            reasons.append(exc.reason)
    # The budget's burst is spent on lookups (each answered "not a member"); the rest are
    # refused before any chain call.
    assert reasons.count("not_a_member") <= CHAIN_BUDGET["burst"] + 1
    assert reasons.count("rate_limited") >= 10 - CHAIN_BUDGET["burst"] - 1


def test_a_worker_who_left_is_refused_leases(pool: Any) -> None:
    time.sleep(CHAIN_BUDGET["burst"] / CHAIN_BUDGET["per_second"])
    account = pool.new_member()
    register(pool, account)
    assert lease(pool, account) is None
    pool.ledger_as(account).leave(pool.pool_id)
    refused = refused_soon(pool, account)  # the WorkerLeft event drops the cached standing
    assert refused is not None and refused.status == 403 and refused.reason == "not_a_member"


def test_a_worker_slashed_below_the_minimum_is_refused_leases(pool: Any) -> None:
    time.sleep(CHAIN_BUDGET["burst"] / CHAIN_BUDGET["per_second"])
    account = pool.new_member()
    register(pool, account)
    assert lease(pool, account) is None
    owner = pool.ledger_as(pool.owner)
    if not owner.is_validator(pool.pool_id, pool.owner.address):
        owner.register_validator(pool.pool_id, pool.owner.address)
    owner.slash(pool.pool_id, account.address, 0, "test")
    refused = refused_soon(pool, account)  # so does WorkerSlashed
    assert refused is not None and refused.status == 403
    assert refused.reason == "stake_below_minimum"


def test_leaving_unbonds_and_withdraw_waits_for_the_period(pool: Any) -> None:
    account = pool.new_member()
    ledger = pool.ledger_as(account)
    settings = WorkerChainSettings(
        pool_id=pool.pool_id, rpc_url=pool.rpc_url, ledger_address=pool.ledger
    )
    line = chain_command("leave", ledger, settings)
    assert "1 ETH unbonds until block" in line and "prime-worker withdraw" in line
    with pytest.raises(JoinError, match="unbonding until block"):
        chain_command("withdraw", ledger, settings)
    with pytest.raises(JoinError, match="unbonding until block"):  # a second leave: one line
        chain_command("leave", ledger, settings)
    assert ledger.stake_of(pool.pool_id, account.address) == MIN_STAKE  # still slashable
    remaining = ledger.unbonding_until(pool.pool_id, account.address) - ledger.block_number()
    ledger.w3.provider.make_request("anvil_mine", [hex(remaining)])
    assert "unbonded: `prime-worker withdraw`" in chain_command("status", ledger, settings)
    assert chain_command("withdraw", ledger, settings) == f"withdrew 1 ETH from pool {pool.pool_id}"
    assert ledger.stake_of(pool.pool_id, account.address) == 0
    assert "not staked (minimum 1 ETH" in chain_command("status", ledger, settings)
    with pytest.raises(JoinError, match="no rewards to claim"):
        chain_command("claim", ledger, settings)


def test_an_unreachable_chain_is_503_not_500(
    anvil: Anvil,
    tmp_path_factory: pytest.TempPathFactory,
    start_live_pool: Callable[..., AbstractContextManager[Any]],
) -> None:
    root = tmp_path_factory.mktemp("dead-rpc")
    redis_server = RedisServer(root / "redis", root / "logs")
    dead_rpc = {"PRIME_ORCH_RPC_URL": f"http://127.0.0.1:{free_port()}", **FAST_CHAIN_TIMEOUT}
    try:
        with start_live_pool(anvil, redis_server.url, root / "logs", dead_rpc) as live:
            client = OrchestratorClient(live.url, live.member, timeout_s=30, retry_budget=0)
            with pytest.raises(OrchestratorError) as err:
                client.register(RegisterRequest(worker=live.member.address, pool_id=live.pool_id))
            assert err.value.status == 503 and err.value.reason == "chain_unavailable"
            assert alive(live)
    finally:
        redis_server.stop()
