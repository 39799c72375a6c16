"""Rate limits kept in Redis (GCRA), shared by every replica of a service.

GCRA stores one number per key, the "theoretical arrival time" of the next request: a steady
`per_second` rate with up to `burst` requests at once, no window edges to game, and the exact
wait to report in `Retry-After`. Time comes from Redis, so replicas with skewed clocks agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field
from redis.asyncio import Redis

RATE_KEY = "rate:{bucket}"

# KEYS[1]: the bucket. ARGV: emission interval (µs), burst. Returns 0 when allowed, otherwise
# the µs to wait. Microsecond integers keep Lua's number handling exact.
_GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tolerance = interval * (tonumber(ARGV[2]) - 1)
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
if tat - now > tolerance then
  return tat - now - tolerance
end
local next_tat = tat + interval
redis.call('SET', KEYS[1], next_tat, 'PX', math.ceil((next_tat - now) / 1000) + 1)
return 0
"""


class Rate(BaseModel):
    """A sustained rate with a burst allowance."""

    per_second: float = Field(gt=0, description="Sustained requests per second.")
    burst: int = Field(ge=1, description="Requests allowed at once before the rate applies.")


@dataclass(frozen=True)
class Limited(Exception):
    """Over the limit; retry after `retry_after_s` seconds."""

    bucket: str
    retry_after_s: float


class RateLimiter:
    def __init__(self, redis: Redis) -> None:
        self._script = redis.register_script(_GCRA)

    async def hit(self, bucket: str, rate: Rate) -> None:
        """Count one request against `bucket`; raise `Limited` if it is over `rate`."""
        interval_us = max(1, round(1_000_000 / rate.per_second))
        wait_us = int(
            await self._script(
                keys=[RATE_KEY.format(bucket=bucket)], args=[interval_us, rate.burst]
            )
        )
        if wait_us > 0:
            raise Limited(bucket, wait_us / 1_000_000)
