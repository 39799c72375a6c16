import asyncio

import pytest
from eth_account import Account

from prime_swarm.protocol.signing import (
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    AuthError,
    require_signer_is,
    sign_request,
    verify_request,
)


def burner() -> object:
    seen: set[tuple[str, str]] = set()

    async def burn(address: str, nonce: str, ttl: int) -> bool:
        if (address, nonce) in seen:
            return False
        seen.add((address, nonce))
        return True

    return burn


def verify(
    headers: dict[str, str],
    body: bytes = b'{"a":1}',
    burn=None,
    now=None,  # noqa: ANN001
    path: str = "/v1/submit",
    query: str = "",
) -> str:
    return asyncio.run(
        verify_request("POST", path, query, body, headers, burn or burner(), now=now)
    )


def test_valid_signature_returns_the_signer() -> None:
    acct = Account.create()
    headers = sign_request(acct, "POST", "/v1/submit", "", b'{"a":1}')
    assert verify(headers) == acct.address


@pytest.mark.parametrize(
    "change",
    [
        {"body": b'{"a":2}'},
        {"path": "/v1/lease"},
        {"query": "x=1"},
    ],
)
def test_any_change_to_the_request_breaks_the_signature(change: dict) -> None:
    acct = Account.create()
    headers = sign_request(acct, "POST", "/v1/submit", "", b'{"a":1}')
    with pytest.raises(AuthError) as err:
        verify(headers, **change)
    assert err.value.status == 401


def test_replayed_nonce_is_refused() -> None:
    acct = Account.create()
    headers = sign_request(acct, "POST", "/v1/submit", "", b'{"a":1}')
    burn = burner()
    verify(headers, burn=burn)
    with pytest.raises(AuthError, match="replayed"):
        verify(headers, burn=burn)


def test_timestamp_window_is_bounded_both_ways() -> None:
    acct = Account.create()
    headers = sign_request(acct, "POST", "/v1/submit", "", b'{"a":1}')
    ts = float(headers[HEADER_TIMESTAMP])
    with pytest.raises(AuthError, match="stale"):
        verify(headers, now=ts + 120)
    with pytest.raises(AuthError, match="future"):
        verify(headers, now=ts - 120)


def test_malformed_and_missing_signatures_are_401() -> None:
    acct = Account.create()
    headers = sign_request(acct, "POST", "/v1/submit", "", b'{"a":1}')
    with pytest.raises(AuthError, match="malformed"):
        verify({**headers, HEADER_SIGNATURE: "0x1234"})
    with pytest.raises(AuthError, match="missing"):
        verify({k: v for k, v in headers.items() if k != HEADER_SIGNATURE})


def test_claiming_another_address_is_refused() -> None:
    acct, other = Account.create(), Account.create()
    headers = sign_request(acct, "POST", "/v1/submit", "", b'{"a":1}')
    headers["x-swarm-address"] = other.address
    with pytest.raises(AuthError, match="does not match"):
        verify(headers)


def test_signer_must_be_the_worker_in_the_body() -> None:
    acct, other = Account.create(), Account.create()
    require_signer_is(acct.address, acct.address.lower())
    with pytest.raises(AuthError) as err:
        require_signer_is(acct.address, other.address)
    assert err.value.status == 403
