"""Pool state kept in Redis: the current policy, workers, leases and the task counter."""

from __future__ import annotations

import logging
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from enum import IntEnum
from typing import NamedTuple

from redis.asyncio import Redis

from prime_swarm.libs.environments.base import hash_int
from prime_swarm.libs.environments.reward import budget_for, with_budget
from prime_swarm.libs.environments.task_lists import load_task_list
from prime_swarm.libs.rollout.admission import oldest_admitted
from prime_swarm.libs.rollout.recipe import EnvShare
from prime_swarm.libs.rollout.selection import parse_rate, prompt_key
from prime_swarm.libs.rollout.task_stream import task_at
from prime_swarm.libs.streams.announcements import latest_announcement_async
from prime_swarm.libs.streams.replication import Replication, ReplicaWait
from prime_swarm.protocol import streams
from prime_swarm.protocol import worker_stats as ws
from prime_swarm.protocol.messages import (
    Lease,
    PolicyAnnouncement,
    PolicyInfo,
    Prompt,
    SamplingParams,
    SubmittedRollout,
)
from prime_swarm.protocol.selection_records import COUNTS, PASS_RATES

from . import metrics
from .settings import OrchestratorSettings

log = logging.getLogger(__name__)

# A worker in these keys is in `protocol.messages.Address` form (lower case), as it arrives from
# a model field or the routes' caller dependency; nothing here lowers it again.
TASK_COUNTER = "orch:task_counter"
WORKERS = "orch:workers"  # hash: address -> registration time
LIVE_WORKERS = "orch:live_workers"  # sorted set: address scored by when it was last heard from
EJECTED = "orch:ejected"  # hash: address -> JSON of the ejection (when, why, transaction)
# Hash {since, last}: since when some orchestrator replica has listened without a gap (each
# replica's ejector marks it every round); silence is only counted while the pool listened.
LISTENING = "orch:listening"
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
        value = await latest_announcement_async(self.redis)
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
        self._mark_listening = redis.register_script(_MARK_LISTENING)
        self._claim_silent = redis.register_script(_CLAIM_SILENT)

    async def register(
        self, worker: str, hardware: str = "", backend: str = "", device: str = ""
    ) -> int:
        """Record the worker (and what it runs on) and count it live; returns how many workers
        are registered."""
        now = time.time()
        info = WORKER_INFO.format(worker=worker)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(WORKERS, worker, now)
            pipe.zadd(LIVE_WORKERS, {worker: now})
            pipe.hset(info, mapping={"hardware": hardware, "backend": backend, "device": device})
            pipe.expire(info, ws.TOTALS_TTL_S)
            pipe.hlen(WORKERS)
            *_, registered = await pipe.execute()
        return int(registered)

    async def is_registered(self, worker: str) -> bool:
        return bool(await self.redis.hexists(WORKERS, worker))

    async def seen(self, worker: str) -> None:
        await self.redis.zadd(LIVE_WORKERS, {worker: time.time()})

    async def seen_and_live(self, worker: str) -> int:
        """`seen`, and how many workers are live now, in one round trip (every lease asks)."""
        now = time.time()
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(LIVE_WORKERS, {worker: now})
            pipe.zcount(LIVE_WORKERS, now - self.settings.heartbeat_ttl_s, "+inf")
            _, live = await pipe.execute()
        return int(live)

    async def mark_listening(self, gap_s: float) -> float:
        """Record that this replica is listening now; returns since when the pool has listened
        without a gap longer than `gap_s` (all replicas down, or Redis out of their reach,
        starts the count again when one is back)."""
        since = await self._mark_listening(keys=[LISTENING], args=[repr(time.time()), gap_s])
        return float(since)

    async def silent(self, silent_for_s: float) -> tuple[list[str], int]:
        """Registered workers not heard from for `silent_for_s`, and how many are registered."""
        cutoff = time.time() - silent_for_s
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrangebyscore(LIVE_WORKERS, "-inf", cutoff)
            pipe.zcard(LIVE_WORKERS)
            raw, registered = await pipe.execute()
        return [w.decode() if isinstance(w, bytes) else w for w in raw], int(registered)

    async def claim(self, worker: str, silent_for_s: float) -> bool:
        """Take a silent worker off the roster, if it is still silent (ZREM decides, so two
        orchestrators never eject the same worker twice). A claimed worker must register
        again, after rejoining on chain, to get work."""
        cutoff = time.time() - silent_for_s
        claimed = await self._claim_silent(keys=[LIVE_WORKERS, WORKERS], args=[worker, cutoff])
        return bool(claimed)

    async def record_ejection(self, worker: str, record: str) -> None:
        await self.redis.hset(EJECTED, worker, record)


# KEYS: the listening hash. ARGV: now, the longest gap that still counts as listening.
_MARK_LISTENING = """
local marks = redis.call('HMGET', KEYS[1], 'since', 'last')
local since, last = tonumber(marks[1]), tonumber(marks[2])
if since == nil or last == nil or tonumber(ARGV[1]) - last > tonumber(ARGV[2]) then
  since = ARGV[1]
  redis.call('HSET', KEYS[1], 'since', since)
end
redis.call('HSET', KEYS[1], 'last', ARGV[1])
return tostring(since)
"""

# KEYS: live workers, workers. ARGV: the worker, the cutoff. Removed only if still silent: a
# worker heard from since the round read the roster stays.
_CLAIM_SILENT = """
local seen = redis.call('ZSCORE', KEYS[1], ARGV[1])
if seen == false or tonumber(seen) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
"""

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


# The lease rule, decided and recorded in one step (a Lua script runs alone on the server).
# `in_flight` counts the pool's groups leased but not yet taken by the trainer: open unexpired
# leases, plus submissions the validators have not finished, plus (synchronous pools only)
# verified groups the trainer has not acknowledged; the batch a trainer is stepping on stays
# pending until its checkpoint is saved but can no longer age, so an asynchronous pool does not
# count it (counting it held a step's worth of the budget idle through every step). Capping it
# keeps the trainer fed while bounding how stale that work gets. The grant is
#   min(requested, cap - the worker's open leases, max_in_flight - in_flight), at least 0,
# where `cap` is the worker's fair share (libs/rollout/admission.py `fair_share`). The granted
# ids enter the open sets here; the lease records follow (a record missing after a crash only
# leaves an id that expires unanswered).
#   KEYS: worker's open set, pool's open set, submitted stream, verified stream
#   ARGV: now, requested, cap, max_in_flight, expiry, ttl, validator group, trainer group,
#         count the trainer's pending (0/1), lease ids...
_RESERVE_LEASES = """
-- Entries of a stream not yet delivered to a group (counted from its last-delivered id, up to
-- `limit`: XINFO's `lag` comes from a counter that a failover can leave behind, and was seen
-- reporting 90 undelivered entries of a group that had read them all, holding the budget full
-- and the pool idle), plus those delivered and not acknowledged.
local function backlog(stream, group, with_pending, limit)
  local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', stream)
  if not ok then return 0 end
  for _, g in ipairs(groups) do
    local f = {}
    for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
    if f['name'] == group then
      local n = #redis.call('XRANGE', stream, '(' .. f['last-delivered-id'], '+', 'COUNT', limit)
      if with_pending then n = n + (tonumber(f['pending']) or 0) end
      return n
    end
  end
  return 0
end
local now, requested = tonumber(ARGV[1]), tonumber(ARGV[2])
local cap, limit = tonumber(ARGV[3]), tonumber(ARGV[4])
local window = math.min(limit, 10000) + 1  -- enough to tell "over the budget"
local in_flight = redis.call('ZCOUNT', KEYS[2], '(' .. ARGV[1], '+inf')
  + backlog(KEYS[3], ARGV[7], true, window) + backlog(KEYS[4], ARGV[8], ARGV[9] == '1', window)
if requested == 0 then return {0, in_flight} end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local grant = math.min(requested, cap - redis.call('ZCARD', KEYS[1]), limit - in_flight)
if grant < 1 then return {0, in_flight} end
for i = 1, grant do
  redis.call('ZADD', KEYS[1], ARGV[5], ARGV[9 + i])
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[9 + i])
end
redis.call('EXPIRE', KEYS[1], ARGV[6])
return {grant, in_flight}
"""


class Admission(IntEnum):
    EXPIRED = -1  # not answered before it expired
    DUPLICATE = 0  # the lease was answered with other content
    ADMITTED_BEFORE = 1  # this very submission was admitted already: a retry
    ADMITTED = 2


# One answer per lease, its effects together: a crash (of Redis, or of the orchestrator between
# two round trips) leaves the submission either wholly in or wholly out, and the worker's retry
# (same content, same id) finds out which.
#   KEYS: answered marker, worker's open set, pool's open set, submitted stream, worker's
#         totals, this minute's bucket
#   ARGV: submission id, marker ttl, lease id, totals ttl, bucket ttl, worker, lease expiry,
#         now, entry fields...
_ADMIT = """
local prior = redis.call('GET', KEYS[1])
if prior then
  if prior ~= ARGV[1] then return 0 end
  -- A retry: rewrite the marker so that this connection's WAIT covers the first admission's
  -- write too (replication is in order; WAIT waits for the connection's last write).
  redis.call('SET', KEYS[1], prior, 'KEEPTTL')
  return 1
end
if tonumber(ARGV[8]) > tonumber(ARGV[7]) then return -1 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[3])
redis.call('ZREM', KEYS[3], ARGV[3])
redis.call('XADD', KEYS[4], '*', unpack(ARGV, 9))
redis.call('HINCRBY', KEYS[5], 'submitted', 1)
redis.call('EXPIRE', KEYS[5], ARGV[4])
redis.call('HINCRBY', KEYS[6], ARGV[6], 1)
redis.call('EXPIRE', KEYS[6], ARGV[5])
return 2
"""


class _Drawn(NamedTuple):
    """A task to lease: its environment's share of the recipe, its id and its prompt."""

    share: EnvShare
    task_id: str
    prompt: Prompt


class LeaseBook:
    """Hands out tasks in order, so no worker chooses its prompt, and remembers who holds what."""

    def __init__(
        self,
        redis: Redis,
        settings: OrchestratorSettings,
        work_id_floor: Callable[[str], Awaitable[int]],
        replica_wait: ReplicaWait | None = None,
    ) -> None:
        """`work_id_floor(worker)`: one past the highest work id the ledger settled for the
        worker, where numbering resumes if Redis lost the counter."""
        self.redis, self.settings = redis, settings
        self._work_id_floor = work_id_floor
        self.replica_wait = replica_wait or ReplicaWait(enabled=False)
        self._reserve = redis.register_script(_RESERVE_WORK_IDS)
        self._reserve_leases = redis.register_script(_RESERVE_LEASES)
        self._admit = redis.register_script(_ADMIT)
        self.envs = settings.recipe.environments()
        # Read once: a task list is fixed for the run, and a bad file should stop start-up, not
        # the first lease. It serves the one environment it names.
        self.task_lists: dict[str, list[str]] = (
            dict([load_task_list(settings.task_file, self.envs)])
            if settings.task_file is not None
            else {}
        )

    async def open_count(self, worker: str) -> int:
        """Unexpired open leases of `worker`."""
        key = OPEN_LEASES.format(worker=worker)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zremrangebyscore(key, "-inf", time.time())  # expired ones no longer count
            pipe.zcard(key)
            _, count = await pipe.execute()
        return int(count)

    async def in_flight(self) -> int:
        """Groups leased but not yet taken by the trainer (see `_RESERVE_LEASES`)."""
        return (await self._grant("", 0, 0, [], 0.0))[1]

    async def _grant(
        self, worker: str, requested: int, cap: int, ids: list[str], expires_at: float
    ) -> tuple[int, int]:
        """(leases granted, groups in flight before them); the granted ones are `ids[:n]`."""
        granted, in_flight = await self._reserve_leases(
            keys=[
                OPEN_LEASES.format(worker=worker),
                ALL_OPEN_LEASES,
                streams.ROLLOUTS_SUBMITTED,
                streams.ROLLOUTS_VERIFIED,
            ],
            args=[
                time.time(),
                requested,
                cap,
                self.settings.max_in_flight_groups,
                expires_at,
                self._record_ttl,
                streams.VALIDATOR_GROUP,
                streams.TRAINER_GROUP,
                int(self.settings.recipe.async_level == 0),
                *ids,
            ],
        )
        return int(granted), int(in_flight)

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
        key = WORK_IDS.format(worker=worker)
        last = int(await self._reserve(keys=[key], args=[count, ""]))
        if last < 0:
            floor = await self._work_id_floor(worker)
            last = int(await self._reserve(keys=[key], args=[count, floor]))
        return range(last - count, last)

    @property
    def _record_ttl(self) -> int:
        # A lease record outlives its expiry long enough to be reclaimed and reissued.
        return 2 * int(self.settings.lease_ttl_s) + 60

    async def issue(
        self, worker: str, pool_id: int, min_version: int, requested: int, cap: int
    ) -> tuple[list[Lease], int]:
        """Up to `requested` leases within the in-flight budget and the worker's `cap` (the
        rule: `_RESERVE_LEASES`), and the groups in flight before them. Their tasks: first
        those of expired leases, then consecutive tasks of the pool's stream."""
        recipe = self.settings.recipe
        expires_at = time.time() + self.settings.lease_ttl_s
        ids = [secrets.token_hex(12) for _ in range(requested)]
        granted, in_flight = await self._grant(worker, requested, cap, ids, expires_at)
        if not granted:
            return [], in_flight
        reissued = await self._reclaim(granted)
        tasks = [
            _Drawn(EnvShare.model_construct(env=o.env, args=o.env_args), o.task_id, o.prompt)
            for o in reissued
        ]
        targets = [o.target_tokens for o in reissued]
        for index, drawn in await self._draw(granted - len(tasks)):
            target = budget_for(index, recipe.length_reward)
            prompt = with_budget(drawn.prompt, target, recipe.length_reward)
            tasks.append(drawn._replace(prompt=prompt))
            targets.append(target)
        work_ids = await self.next_work_ids(worker, len(tasks))
        leases = [
            Lease(
                lease_id=lease_id,
                worker=worker,
                pool_id=pool_id,
                work_id=work_id,
                env=drawn.share.env,
                env_args=drawn.share.args,
                task_id=drawn.task_id,
                prompt=drawn.prompt,
                target_tokens=target,
                format_reward=recipe.format_reward,
                group_size=recipe.group_size,
                sampling=SamplingParams(
                    temperature=recipe.temperature, max_new_tokens=recipe.max_new_tokens
                ),
                seed=secrets.randbits(62),
                min_policy_version=min_version,
                expires_at=expires_at,
            )
            for lease_id, drawn, target, work_id in zip(ids, tasks, targets, work_ids, strict=False)
        ]
        async with self.redis.pipeline(transaction=True) as pipe:
            for lease in leases:
                record = LEASE.format(lease_id=lease.lease_id)
                pipe.set(record, lease.model_dump_json(), ex=self._record_ttl)
            if reissued:
                pipe.incrby(REISSUED, len(reissued))
            info = WORKER_INFO.format(worker=worker)
            pipe.hincrby(info, "leases", len(leases))
            pipe.expire(info, ws.TOTALS_TTL_S)
            await pipe.execute()
        for lease in leases:
            metrics.LEASES_BY_ENV.labels(lease.env).inc()
        if reissued:
            metrics.LEASES_REISSUED.inc(len(reissued))
            log.info(
                "reissued expired leases",
                extra={"fields": {"worker": worker, "expired": [o.lease_id for o in reissued]}},
            )
        return leases, in_flight

    def _task_at(self, index: int) -> _Drawn:
        """The pool's index-th task (libs/rollout/task_stream.py)."""
        share, task = task_at(
            self.settings.recipe,
            self.envs,
            self.settings.task_seed,
            index,
            train_tasks=self.settings.train_tasks,
            task_lists=self.task_lists,
        )
        return _Drawn(share, task.task_id, task.prompt)

    async def _draw(self, count: int) -> list[tuple[int, _Drawn]]:
        """`count` tasks from the pool's stream, as (index, task). With live selection, a
        task whose prompt the policy has mastered or cannot yet solve is skipped (unless the
        exploration floor takes it) and the next index drawn, at most `max_skips` times a
        lease; what was skipped, explored and forced is counted per environment."""
        selection = self.settings.recipe.selection
        chosen: list[tuple[int, _Drawn]] = []
        counts: Counter[str] = Counter()
        for attempt in range(selection.max_skips + 1 if selection.enabled else 1):
            want = count - len(chosen)
            if not want:
                break
            last = int(await self.redis.incrby(TASK_COUNTER, want))
            drawn = [(i, self._task_at(i)) for i in range(last - want, last)]
            if not selection.enabled:
                chosen += drawn
                break
            # Before the thinking budget is prefixed: the key is the problem's own text.
            keys = [prompt_key(d.share.env, d.prompt) for _, d in drawn]
            rates = await self.redis.hmget(PASS_RATES, keys)
            final = attempt == selection.max_skips
            for (index, d), raw in zip(drawn, rates, strict=True):
                rate = parse_rate(raw)
                counts[f"{d.share.env}:drawn"] += 1
                explore = hash_int("explore", self.settings.task_seed, index, nbytes=6) / 2**48
                if selection.in_band(rate):
                    chosen.append((index, d))
                elif explore < selection.explore:
                    counts[f"{d.share.env}:explored"] += 1
                    chosen.append((index, d))
                elif final:
                    counts[f"{d.share.env}:forced"] += 1
                    chosen.append((index, d))
                else:
                    counts[f"{d.share.env}:skipped"] += 1
        if counts:
            async with self.redis.pipeline(transaction=False) as pipe:
                for field, n in counts.items():
                    pipe.hincrby(COUNTS, field, n)
                await pipe.execute()
            for field, n in counts.items():
                env, what = field.rsplit(":", 1)
                metrics.PROMPTS_SELECTED.labels(env, what).inc(n)
        return chosen

    async def admit(self, entry: SubmittedRollout) -> tuple[Admission, Replication | None]:
        """Record the answer to a lease: the lease closed, the submission on the validators'
        stream, the worker's counts, in one script. A second answer with the same content is
        the worker retrying one whose reply it lost (ADMITTED_BEFORE: answered as the first
        was); with other content, DUPLICATE. With replicas, the answer waits until one holds
        it (`Replication`; None: not asked)."""
        lease, worker = entry.lease, entry.lease.worker
        fields = streams.encode(entry)
        async with self.redis.pipeline(transaction=False) as pipe:
            await self._admit(
                keys=[
                    SUBMITTED.format(lease_id=lease.lease_id),
                    OPEN_LEASES.format(worker=worker),
                    ALL_OPEN_LEASES,
                    streams.ROLLOUTS_SUBMITTED,
                    WORKER_INFO.format(worker=worker),
                    SUBMITS_PER_MINUTE.format(minute=ws.minute(time.time())),
                ],
                args=[
                    entry.submission_id,
                    int(self.settings.lease_ttl_s) * 10,
                    lease.lease_id,
                    ws.TOTALS_TTL_S,
                    ws.BUCKET_TTL_S,
                    worker,
                    lease.expires_at,
                    time.time(),
                    *(x for kv in fields.items() for x in kv),
                ],
                client=pipe,
            )
            waits = self.replica_wait.queue(pipe)
            outcome, *replicated = await pipe.execute()
        replication = (
            await self.replica_wait.verdict_async(self.redis, *replicated) if waits else None
        )
        return Admission(int(outcome)), replication

    async def close(self, lease: Lease) -> None:
        """The lease no longer counts as open work (answered, or refused beyond repair)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrem(OPEN_LEASES.format(worker=lease.worker), lease.lease_id)
            pipe.zrem(ALL_OPEN_LEASES, lease.lease_id)
            await pipe.execute()

    async def get(self, lease_id: str) -> Lease | None:
        raw = await self.redis.get(LEASE.format(lease_id=lease_id))
        return Lease.model_validate_json(raw) if raw else None
