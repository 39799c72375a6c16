"""Pool state kept in Redis: the current policy, workers, leases and the task counter."""

from __future__ import annotations

import secrets
import time

from redis.asyncio import Redis

from prime_swarm.libs.rl.envs import get_env
from prime_swarm.libs.rl.envs.base import hash_int
from prime_swarm.libs.rollout.admission import oldest_admitted
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import Lease, PolicyAnnouncement, PolicyInfo, SamplingParams

from .settings import OrchestratorSettings

TASK_COUNTER = "orch:task_counter"
WORKERS = "orch:workers"  # hash: address -> last heartbeat time
LEASE = "orch:lease:{lease_id}"
OPEN_LEASES = "orch:open_leases:{worker}"  # set of lease ids per worker
SUBMITTED = "orch:submitted:{lease_id}"


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


class LeaseBook:
    """Hands out tasks in order, so no worker chooses its prompt, and remembers who holds what."""

    def __init__(self, redis: Redis, settings: OrchestratorSettings) -> None:
        self.redis, self.settings = redis, settings
        self.env = get_env(settings.recipe.env)

    async def open_count(self, worker: str) -> int:
        key = OPEN_LEASES.format(worker=worker.lower())
        # Drop ids whose lease record expired: they no longer count against the worker.
        ids = await self.redis.smembers(key)
        live = 0
        for lid in ids:
            lid_s = lid.decode() if isinstance(lid, bytes) else lid
            if await self.redis.exists(LEASE.format(lease_id=lid_s)):
                live += 1
            else:
                await self.redis.srem(key, lid)
        return live

    async def issue(self, worker: str, pool_id: int, min_version: int) -> Lease:
        index = int(await self.redis.incr(TASK_COUNTER)) - 1
        # The pool's task stream is a pure function of (seed, counter): workers cannot steer it.
        task_index = hash_int("lease", self.settings.task_seed, index, nbytes=6)
        task = self.env.task_from_id(self.env.task_id("train", task_index))
        recipe = self.settings.recipe
        now = time.time()
        lease = Lease(
            lease_id=secrets.token_hex(12),
            worker=worker,
            pool_id=pool_id,
            env=recipe.env,
            task_id=task.task_id,
            prompt=task.prompt,
            group_size=recipe.group_size,
            sampling=SamplingParams(
                temperature=recipe.temperature, max_new_tokens=recipe.max_new_tokens
            ),
            seed=secrets.randbits(62),
            min_policy_version=min_version,
            expires_at=now + self.settings.lease_ttl_s,
        )
        ttl = int(self.settings.lease_ttl_s) + 60
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(LEASE.format(lease_id=lease.lease_id), lease.model_dump_json(), ex=ttl)
            pipe.sadd(OPEN_LEASES.format(worker=worker.lower()), lease.lease_id)
            pipe.expire(OPEN_LEASES.format(worker=worker.lower()), ttl)
            await pipe.execute()
        return lease

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
            await self.redis.srem(OPEN_LEASES.format(worker=lease.worker.lower()), lease.lease_id)
        return bool(first)
