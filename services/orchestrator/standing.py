"""A worker's standing in the pool, read from the chain and cached until the chain changes it.

Every lease and submission needs it (a worker who left or was slashed below the minimum must stop
at once, not at its next registration). Re-reading it every few seconds cost the orchestrator
more CPU than anything else under load (bench-orchestrator: web3 calls were 28 % of its CPU at
100 workers), so answers are cached for `standing_cache_s` and `watch_standing_events` drops a
worker's entry as soon as a ledger event touches its stake or membership (one `eth_getLogs` per
event kind and poll, whatever the number of workers). Lookups of addresses not in the cache
draw on one pool-wide budget: a flood of throwaway keys can make the orchestrator spend only
that many chain calls, whatever the rate of requests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Literal

from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.chain.errors import ChainError
from prime_swarm.libs.guard.ratelimit import Rate, RateLimiter
from prime_swarm.protocol.messages import normal_address

log = logging.getLogger("orchestrator.standing")

CHAIN_BUDGET_BUCKET = "chain-lookups"
STANDING_EVENTS = (
    "WorkerJoined",
    "StakeAdded",
    "WorkerLeft",
    "WorkerEjected",
    "WorkerSlashed",
    "StakeWithdrawn",
)
"""Every ledger event that changes a worker's membership or stake."""

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
        self._forgotten: dict[str, float] = {}  # worker -> when an event last dropped its entry
        self._min_stake: tuple[float, int] | None = None

    async def of(self, worker: str) -> Standing:
        """The worker's standing, at most `ttl_s` old. Raises `Limited` when an uncached lookup
        would exceed the pool-wide chain budget. `worker` is normalised (an `Address`)."""
        key = worker
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        await self.limiter.hit(CHAIN_BUDGET_BUCKET, self.lookup_budget)
        standing = await asyncio.to_thread(self._read, worker)
        if len(self._cache) > 100_000:  # throwaway keys must not grow the cache without bound
            self._cache.clear()
            self._forgotten.clear()
        # An event seen while this read was in flight may postdate what it read: answer with
        # it, but do not keep it.
        if self._forgotten.get(key, -1.0) < now:
            self._cache[key] = (time.monotonic(), standing)
        return standing

    def forget(self, worker: str) -> None:
        key = normal_address(worker)  # chain events name workers in EIP-55
        self._cache.pop(key, None)
        self._forgotten[key] = time.monotonic()

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


async def watch_standing_events(book: StandingBook, interval_s: float) -> None:
    """Forever: every `interval_s`, read the ledger events of the blocks since the last poll
    and drop the cached standing of every worker they name. A chain error skips a poll and
    the next one covers the same blocks again; the cache's own expiry bounds what a long
    outage can leave stale."""
    ledger, pool_id = book.ledger, book.pool_id
    next_block: int | None = None
    while True:
        try:
            head = await asyncio.to_thread(ledger.block_number)
            if next_block is None:
                next_block = head + 1  # the cache is empty at start: nothing older matters
            elif head >= next_block:
                touched = await asyncio.to_thread(
                    _workers_touched, ledger, pool_id, next_block, head
                )
                for worker in touched:
                    book.forget(worker)
                next_block = head + 1
        except ChainError as exc:
            log.warning("standing events not read, retrying: %s", exc)
        await asyncio.sleep(interval_s)


def _workers_touched(ledger: LedgerClient, pool_id: int, first: int, last: int) -> set[str]:
    return {
        str(ev["args"]["worker"])
        for name in STANDING_EVENTS
        for ev in ledger.events(name, from_block=first, to_block=last, pool_id=pool_id)
    }
