"""The FastAPI side of request signing: a dependency that yields the verified signer.

Kept apart from `signing.py` so that clients (workers) need neither FastAPI nor Redis.
"""

from __future__ import annotations

from fastapi import HTTPException, Request
from redis.asyncio import Redis

from .messages import normal_address
from .signing import AuthError, NonceBurner, verify_request

NONCE_KEY = "auth:nonce:{address}:{nonce}"


def redis_nonce_burner(redis: Redis) -> NonceBurner:
    async def burn(address: str, nonce: str, ttl_s: int) -> bool:
        key = NONCE_KEY.format(address=normal_address(address), nonce=nonce)
        return bool(await redis.set(key, b"1", nx=True, ex=ttl_s))

    return burn


class SignedRequest:
    """Dependency: `signer: str = Depends(SignedRequest(get_redis))`."""

    def __init__(self, burner: NonceBurner, max_skew_s: float) -> None:
        self.burner = burner
        self.max_skew_s = max_skew_s

    async def __call__(self, request: Request) -> str:
        body = await request.body()
        try:
            return await verify_request(
                request.method,
                request.url.path,
                request.url.query,
                body,
                {k.lower(): v for k, v in request.headers.items()},
                self.burner,
                max_skew_s=self.max_skew_s,
            )
        except AuthError as exc:
            raise HTTPException(status_code=exc.status, detail=exc.reason) from exc
