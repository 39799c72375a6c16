"""Pool state kept in Redis: the current policy, workers, leases and the task counter."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from prime_swarm.libs.environments.base import hash_int
from prime_swarm.libs.rl.filtering import load_task_list
from prime_swarm.libs.rl.reward import budget_for, with_budget
from prime_swarm.libs.rollout.admission import oldest_admitted
from prime_swarm.protocol import streams
from prime_swarm.protocol import worker_stats as ws
from prime_swarm.protocol.messages import Lease, PolicyAnnouncement, PolicyInfo, SamplingParams

from . import metrics
from .settings import OrchestratorSettings

log = logging.getLogger(__name__)

TASK_COUNTER = "orch:task_counter"
WORKERS = "orch:workers"  # hash: address -> registration time
LIVE_WORKERS = "orch:live_workers"  # sorted set: address scored by when it was last heard from
EJECTED = "orch:ejected"  # hash: address -> JSON of the ejection (when, why, transaction)
LEASE = "orch:lease:{lease_id}"
# Sorted sets of open lease ids scored by expiry: per worker, and pool-wide for admission.
OPEN_LEASES = "orch:open_leases:{worker}"
ALL_OPEN_LEASES = "orch:open_leases"
SUBMITTED = "orch:submitted:{lease_id}"
# Per worker: the next work id (a lease's name on the ledger, see `LeaseBook.next_work_ids`).
WORK_IDS = "orch:work_ids:{worker}"
REISSUED = "orch:reissued"  # counter of expired leases whose task was handed out again
# Per-worker facts the orchestrator learns (protocol/worker_stats.py has the validator's):
# hash of hardware, backend, device (as registered) and the counts of leases and submissions.
WORKER_INFO = "orch:worker:{worker}"
SUBMITS_PER_MINUTE = "orch:submits:{minute}"  # hash: worker -> submissions admitted that minute


class PolicyTracker:
    """Latest announced policy, read from the trainer's announcement stream."""

    def __init__(self, redis: Redis, settings: OrchestratorSettings) -> None:
        self.redis, self.settings = redis, settings
        self._cached: tuple[float, PolicyAnnouncement | None] = (0.0, None)

    async def latest(self) -> PolicyAnnouncement | None:
        at, value = self._cached
        if time.monotonic() - at < 0.25:
            return value
        entries = await self.redis.xrevrange(streams.POLICY_ANNOUNCEMENTS, count=1)
        value = streams.decode(PolicyAnnouncement, entries[0][1]) if entries else None
        self._cached = (time.monotonic(), value)
        return value

    async def info(self) -> PolicyInfo | None:
        ann = await self.latest()
        if ann is None:
            return None
        return PolicyInfo(
            version=ann.version,
            model_hash=ann.model_hash,
            manifest_path=ann.manifest_path,
            relays=self.settings.relays,
            min_version=oldest_admitted(ann.version, self.settings.recipe.async_level),
        )


class WorkerRoster:
    """Who registered, and who has been heard from (heartbeat, lease) within the TTL."""

    def __init__(self, redis: Redis, settings: OrchestratorSettings) -> None:
        self.redis, self.settings = redis, settings

    async def register(
        self, worker: str, hardware: str = "", backend: str = "", device: str = ""
    ) -> int:
        """Record the worker (and what it runs on) and count it live; returns how many workers
        are registered."""
        now = time.time()
        info = WORKER_INFO.format(worker=worker.lower())
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(WORKERS, worker.lower(), now)
            pipe.zadd(LIVE_WORKERS, {worker.lower(): now})
            pipe.hset(info, mapping={"hardware": hardware, "backend": backend, "device": device})
            pipe.expire(info, ws.TOTALS_TTL_S)
            pipe.hlen(WORKERS)
            *_, registered = await pipe.execute()
        return int(registered)

    @staticmethod
    def count_submission(pipe: Pipeline, worker: str) -> None:
        """Queue on `pipe` the count of one more admitted submission (the worker's total and
        this minute's bucket): it rides with the submission's own write, no extra round trip."""
        info = WORKER_INFO.format(worker=worker.lower())
        bucket = SUBMITS_PER_MINUTE.format(minute=ws.minute(time.time()))
        pipe.hincrby(info, "submitted", 1)
        pipe.expire(info, ws.TOTALS_TTL_S)
        pipe.hincrby(bucket, worker.lower(), 1)
        pipe.expire(bucket, ws.BUCKET_TTL_S)

    async def is_registered(self, worker: str) -> bool:
        return bool(await self.redis.hexists(WORKERS, worker.lower()))

    async def seen(self, worker: str) -> None:
        await self.redis.zadd(LIVE_WORKERS, {worker.lower(): time.time()})

    async def seen_and_live(self, worker: str) -> int:
        """`seen`, and how many workers are live now, in one round trip (every lease asks)."""
        now = time.time()
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(LIVE_WORKERS, {worker.lower(): now})
            pipe.zcount(LIVE_WORKERS, now - self.settings.heartbeat_ttl_s, "+inf")
            _, live = await pipe.execute()
        return int(live)

    async def claim_silent(self, silent_for_s: float, limit: int = 16) -> list[str]:
        """Registered workers not heard from for `silent_for_s`, each removed from the roster as
        it is claimed (ZREM decides, so two orchestrators never eject the same worker twice).
        A claimed worker must register again, after rejoining on chain, to get work."""
        cutoff = time.time() - silent_for_s
        claimed = []
        for raw in await self.redis.zrangebyscore(LIVE_WORKERS, "-inf", cutoff, 0, limit):
            worker = raw.decode() if isinstance(raw, bytes) else raw
            if await self.redis.zrem(LIVE_WORKERS, worker):
                await self.redis.hdel(WORKERS, worker)
                claimed.append(worker)
        return claimed

    async def record_ejection(self, worker: str, record: str) -> None:
        await self.redis.hset(EJECTED, worker.lower(), record)


# Reserve ARGV[1] ids; -1 when the counter is missing and no floor (ARGV[2]) was given, so the
# caller reads one from the chain and asks again. SET NX: of two requests that both found it
# missing, the first floor wins and both reserve after it.
_RESERVE_WORK_IDS = """
if ARGV[2] ~= '' then
  redis.call('SET', KEYS[1], ARGV[2], 'NX')
elseif redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
return redis.call('INCRBY', KEYS[1], ARGV[1])
"""


class LeaseBook:
    """Hands out tasks in order, so no worker chooses its prompt, and remembers who holds what."""

    def __init__(
        self,
        redis: Redis,
        settings: OrchestratorSettings,
        work_id_floor: Callable[[str], Awaitable[int]],
    ) -> None:
        """`work_id_floor(worker)`: one past the highest work id the ledger settled for the
        worker, where numbering resumes if Redis lost the counter."""
        self.redis, self.settings = redis, settings
        self._work_id_floor = work_id_floor
        self._reserve = redis.register_script(_RESERVE_WORK_IDS)
        self.env = settings.recipe.environment()
        # Read once: a task list is fixed for the run, and a bad file should stop start-up, not
        # the first lease.
        self.task_ids: list[str] | None = (
            load_task_list(settings.task_file, self.env) if settings.task_file is not None else None
        )

    async def open_count(self, worker: str | None = None) -> int:
        """Unexpired open leases of `worker`, or of the whole pool."""
        now = time.time()
        if worker is None:
            # Expired entries stay in the pool-wide set until `_reclaim` hands their tasks out.
            return int(await self.redis.zcount(ALL_OPEN_LEASES, f"({now}", "+inf"))
        key = OPEN_LEASES.format(worker=worker.lower())
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zremrangebyscore(key, "-inf", now)  # expired ones no longer count
            pipe.zcard(key)
            _, count = await pipe.execute()
        return int(count)

    async def _reclaim(self, limit: int) -> list[Lease]:
        """Up to `limit` leases that expired unanswered (a worker crashed or vanished), claimed
        for reissue. ZREM decides the claim, so concurrent requests, or orchestrator replicas,
        never hand out the same task twice."""
        ids = await self.redis.zrangebyscore(ALL_OPEN_LEASES, "-inf", time.time(), 0, limit)
        reclaimed = []
        for raw_id in ids:
            lease_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
            if not await self.redis.zrem(ALL_OPEN_LEASES, lease_id):
                continue  # another request claimed it first
            if await self.redis.exists(SUBMITTED.format(lease_id=lease_id)):
                continue  # answered in the instant before expiry
            lease = await self.get(lease_id)
            if lease is not None:
                reclaimed.append(lease)
        return reclaimed

    async def next_work_ids(self, worker: str, count: int) -> range:
        """`count` fresh work ids of `worker`: consecutive, so the ledger settles 256 of them
        per storage slot, and never reused, so no honest item is refused as a duplicate."""
        key = WORK_IDS.format(worker=worker.lower())
        last = int(await self._reserve(keys=[key], args=[count, ""]))
        if last < 0:
            floor = await self._work_id_floor(worker)
            last = int(await self._reserve(keys=[key], args=[count, floor]))
        return range(last - count, last)

    async def issue(self, worker: str, pool_id: int, min_version: int, count: int) -> list[Lease]:
        """`count` leases, recorded in one round trip: first the tasks of expired leases, then
        consecutive tasks of the pool's stream."""
        recipe = self.settings.recipe
        now = time.time()
        reissued = await self._reclaim(count)
        # (task id, prompt, target length) of each lease to hand out.
        tasks = [(old.task_id, old.prompt, old.target_tokens) for old in reissued]
        fresh = count - len(tasks)
        if fresh:
            last = int(await self.redis.incrby(TASK_COUNTER, fresh))
            for index in range(last - fresh, last):
                # The pool's task stream is a pure function of (seed, counter): no worker
                # steers it.
                pick = hash_int("lease", self.settings.task_seed, index, nbytes=6)
                if self.task_ids is not None:
                    task = self.env.task_from_id(self.task_ids[pick % len(self.task_ids)])
                else:
                    task = self.env.task_from_id(self.env.task_id("train", pick))
                target = budget_for(index, recipe.length_reward)
                tasks.append(
                    (task.task_id, with_budget(task.prompt, target, recipe.length_reward), target)
                )
        work_ids = await self.next_work_ids(worker, len(tasks))
        leases = [
            Lease(
                lease_id=secrets.token_hex(12),
                worker=worker,
                pool_id=pool_id,
                work_id=work_id,
                env=recipe.env,
                env_args=recipe.env_args,
                task_id=task_id,
                prompt=prompt,
                target_tokens=target,
                group_size=recipe.group_size,
                sampling=SamplingParams(
                    temperature=recipe.temperature, max_new_tokens=recipe.max_new_tokens
                ),
                seed=secrets.randbits(62),
                min_policy_version=min_version,
                expires_at=now + self.settings.lease_ttl_s,
            )
            for (task_id, prompt, target), work_id in zip(tasks, work_ids, strict=True)
        ]
        # A lease record outlives its expiry long enough to be reclaimed and reissued.
        ttl = 2 * int(self.settings.lease_ttl_s) + 60
        mine = OPEN_LEASES.format(worker=worker.lower())
        async with self.redis.pipeline(transaction=True) as pipe:
            for lease in leases:
                pipe.set(LEASE.format(lease_id=lease.lease_id), lease.model_dump_json(), ex=ttl)
                pipe.zadd(mine, {lease.lease_id: lease.expires_at})
                pipe.zadd(ALL_OPEN_LEASES, {lease.lease_id: lease.expires_at})
            if reissued:
                pipe.incrby(REISSUED, len(reissued))
            pipe.expire(mine, ttl)
            info = WORKER_INFO.format(worker=worker.lower())
            pipe.hincrby(info, "leases", len(leases))
            pipe.expire(info, ws.TOTALS_TTL_S)
            await pipe.execute()
        if reissued:
            metrics.LEASES_REISSUED.inc(len(reissued))
            log.info(
                "reissued expired leases",
                extra={"fields": {"worker": worker, "expired": [o.lease_id for o in reissued]}},
            )
        return leases

    async def close(self, lease: Lease) -> None:
        """The lease no longer counts as open work (answered, or refused beyond repair)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrem(OPEN_LEASES.format(worker=lease.worker.lower()), lease.lease_id)
            pipe.zrem(ALL_OPEN_LEASES, lease.lease_id)
            await pipe.execute()

    async def get(self, lease_id: str) -> Lease | None:
        raw = await self.redis.get(LEASE.format(lease_id=lease_id))
        return Lease.model_validate_json(raw) if raw else None

    async def mark_submitted(self, lease: Lease, submission_id: str) -> bool:
        """True the first time a lease is answered; a second answer is a duplicate."""
        first = await self.redis.set(
            SUBMITTED.format(lease_id=lease.lease_id),
            submission_id,
            nx=True,
            ex=int(self.settings.lease_ttl_s) * 10,
        )
        if first:
            await self.close(lease)
        return bool(first)
