"""A worker's standing in the pool, read from the chain and cached briefly.

Every lease and submission needs it (a worker who left or was slashed below the minimum must stop
at once, not at its next registration), so answers are cached for a few seconds, and lookups of
addresses not in the cache draw on one pool-wide budget: a flood of throwaway keys can make the
orchestrator spend only that many chain calls, whatever the rate of requests.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Literal

from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.guard.ratelimit import Rate, RateLimiter

CHAIN_BUDGET_BUCKET = "chain-lookups"

StandingVerdict = Literal["ok", "not_a_member", "stake_below_minimum"]


@dataclass(frozen=True)
class Standing:
    verdict: StandingVerdict
    stake: int
    min_stake: int

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    def explain(self, worker: str, pool_id: int) -> str:
        if self.verdict == "not_a_member":
            return f"{worker} is not a member of pool {pool_id} (never joined, or left)"
        return (
            f"{worker} has {self.stake} wei staked in pool {pool_id}, below the minimum "
            f"{self.min_stake}; top it up with `join`"
        )


class StandingBook:
    def __init__(
        self,
        ledger: LedgerClient,
        limiter: RateLimiter,
        pool_id: int,
        ttl_s: float,
        lookup_budget: Rate,
    ) -> None:
        self.ledger, self.limiter, self.pool_id = ledger, limiter, pool_id
        self.ttl_s, self.lookup_budget = ttl_s, lookup_budget
        self._cache: dict[str, tuple[float, Standing]] = {}
        self._min_stake: tuple[float, int] | None = None

    async def of(self, worker: str) -> Standing:
        """The worker's standing, at most `ttl_s` old. Raises `Limited` when an uncached lookup
        would exceed the pool-wide chain budget."""
        key = worker.lower()
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        await self.limiter.hit(CHAIN_BUDGET_BUCKET, self.lookup_budget)
        standing = await asyncio.to_thread(self._read, worker)
        if len(self._cache) > 100_000:  # throwaway keys must not grow the cache without bound
            self._cache.clear()
        self._cache[key] = (time.monotonic(), standing)
        return standing

    def forget(self, worker: str) -> None:
        self._cache.pop(worker.lower(), None)

    def _read(self, worker: str) -> Standing:
        min_stake = self._pool_min_stake()
        if not self.ledger.is_member(self.pool_id, worker):
            return Standing("not_a_member", 0, min_stake)
        stake = self.ledger.stake_of(self.pool_id, worker)
        verdict: StandingVerdict = "ok" if stake >= min_stake else "stake_below_minimum"
        return Standing(verdict, stake, min_stake)

    def _pool_min_stake(self) -> int:
        # The minimum is fixed at pool creation; one read a minute is plenty.
        now = time.monotonic()
        if self._min_stake is None or now - self._min_stake[0] > 60:
            self._min_stake = (now, self.ledger.get_pool(self.pool_id).min_stake)
        return self._min_stake[1]
