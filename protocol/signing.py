"""EIP-191 request signing for every worker request.

A worker signs a canonical string over method, path, query, body hash, timestamp and a nonce with
its Ethereum key. The orchestrator recovers the signer, bounds the timestamp in both directions,
burns the nonce (Redis `SET NX` with expiry, so a replay inside the window is refused) and later
checks that the signer is the worker the body talks about.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass

import httpx
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount

from .messages import normal_address

HEADER_ADDRESS = "x-swarm-address"
HEADER_TIMESTAMP = "x-swarm-timestamp"
HEADER_NONCE = "x-swarm-nonce"
HEADER_SIGNATURE = "x-swarm-signature"
SCHEME = "prime-swarm-request-v1"

MAX_CLOCK_SKEW_S = 30.0
NONCE_TTL_S = int(2 * MAX_CLOCK_SKEW_S) + 5


def canonical_request(
    method: str, path: str, query: str, body: bytes, timestamp: str, nonce: str
) -> str:
    """The exact text that is signed. Query is the raw query string, as sent."""
    return "\n".join(
        [SCHEME, method.upper(), path, query, hashlib.sha256(body).hexdigest(), timestamp, nonce]
    )


def sign_request(
    account: LocalAccount, method: str, path: str, query: str, body: bytes
) -> dict[str, str]:
    timestamp = f"{time.time():.3f}"
    nonce = secrets.token_hex(16)
    text = canonical_request(method, path, query, body, timestamp, nonce)
    signed = account.sign_message(encode_defunct(text=text))
    return {
        HEADER_ADDRESS: account.address,
        HEADER_TIMESTAMP: timestamp,
        HEADER_NONCE: nonce,
        HEADER_SIGNATURE: "0x" + signed.signature.hex().removeprefix("0x"),
    }


class WorkerAuth(httpx.Auth):
    """httpx auth that signs each request with the worker's key."""

    requires_request_body = True

    def __init__(self, account: LocalAccount) -> None:
        self.account = account

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        query = request.url.query.decode() if isinstance(request.url.query, bytes) else ""
        headers = sign_request(
            self.account, request.method, request.url.path, query, request.content
        )
        request.headers.update(headers)
        yield request


@dataclass
class AuthError(Exception):
    status: int
    reason: str

    def __str__(self) -> str:
        return f"{self.status}: {self.reason}"


NonceBurner = Callable[[str, str, int], Awaitable[bool]]
"""(address, nonce, ttl_s) -> True if the nonce was unused and is now burned."""


async def verify_request(
    method: str,
    path: str,
    query: str,
    body: bytes,
    headers: dict[str, str],
    burn_nonce: NonceBurner,
    now: float | None = None,
    max_skew_s: float = MAX_CLOCK_SKEW_S,
) -> str:
    """Return the checksummed signer address or raise `AuthError` with a reason."""
    missing = [
        h
        for h in (HEADER_ADDRESS, HEADER_TIMESTAMP, HEADER_NONCE, HEADER_SIGNATURE)
        if not headers.get(h)
    ]
    if missing:
        raise AuthError(401, f"missing signature headers: {', '.join(missing)}")
    claimed, ts, nonce, sig = (
        headers[HEADER_ADDRESS],
        headers[HEADER_TIMESTAMP],
        headers[HEADER_NONCE],
        headers[HEADER_SIGNATURE],
    )
    try:
        ts_value = float(ts) if len(ts) <= 32 else math.nan
    except ValueError:
        ts_value = math.nan
    # float() also reads "nan" and "inf", which compare false against any window.
    if not math.isfinite(ts_value):
        raise AuthError(401, "timestamp is not a finite number of seconds")
    now = time.time() if now is None else now
    if ts_value < now - max_skew_s:
        raise AuthError(401, f"stale request: timestamp {now - ts_value:.1f}s in the past")
    if ts_value > now + max_skew_s:
        raise AuthError(401, f"timestamp {ts_value - now:.1f}s in the future")
    if not (8 <= len(nonce) <= 128) or not nonce.isalnum():
        raise AuthError(401, "nonce must be 8..128 alphanumeric characters")
    text = canonical_request(method, path, query, body, ts, nonce)
    try:
        signer = Account.recover_message(encode_defunct(text=text), signature=sig)
    except Exception as exc:  # eth-account raises several types for malformed signatures
        raise AuthError(401, f"malformed signature: {type(exc).__name__}") from exc
    try:
        matches = normal_address(signer) == normal_address(claimed)
    except ValueError:  # the claimed header is not an address at all
        matches = False
    if not matches:
        raise AuthError(401, "signature does not match the claimed address or request")
    if not await burn_nonce(signer, nonce, NONCE_TTL_S):
        raise AuthError(401, "replayed nonce")
    return signer


def require_signer_is(signer: str, worker: str) -> None:
    """The signer must be the worker the request is about: nobody acts for someone else."""
    if normal_address(signer) != normal_address(worker):
        raise AuthError(403, f"signed by {signer}, but the request is for worker {worker}")
