"""What the status API shows, assembled from Redis: the policy, the workers with the counts each
role keeps (protocol/worker_stats.py), recent rewards from the trainer's progress stream, and the
relays' health, checked here.

A page load costs a bounded number of Redis commands whatever the pool's history (one pipeline:
a few per listed worker, one per throughput bucket), and one answer is reused for
`status_cache_s`; relays are checked at most once per `relay_check_interval_s`, whoever asks.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence

import httpx
from eth_utils import to_checksum_address
from pydantic import ValidationError
from redis.asyncio import Redis

from prime_swarm.libs.guard import untrusted_json
from prime_swarm.libs.rollout.admission import oldest_admitted
from prime_swarm.protocol import streams
from prime_swarm.protocol import worker_stats as ws
from prime_swarm.protocol.messages import (
    PoolStatus,
    RelayHealth,
    RewardPoint,
    StepProgress,
    WorkerStatus,
    normal_address,
)

from .settings import OrchestratorSettings
from .state import EJECTED, LIVE_WORKERS, SUBMITS_PER_MINUTE, WORKER_INFO, WORKERS, PolicyTracker

HEALTH_BODY_LIMIT = 4096  # a relay's /healthz is a few dozen bytes; read no more than this


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _int(value: bytes | str | None) -> int:
    try:
        return max(0, int(_text(value) or 0))
    except ValueError:
        return 0


def _fields(raw: dict) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in raw.items()}


def worker_row(
    address: str,
    *,
    now: float,
    live_ttl_s: float,
    last_seen: float | None,
    registered: bool,
    ejected: bool,
    info: dict,
    ejection: str = "",
    verdicts: dict,
    submits: Sequence[bytes | str | None],
    accepts: Sequence[bytes | str | None],
) -> WorkerStatus:
    """One worker's row from the raw Redis replies: `info` (orchestrator's hash), `verdicts`
    (validator's hash), and its counts in each bucket of `worker_stats.window(now)`."""
    mine, theirs = _fields(info), _fields(verdicts)
    return WorkerStatus(
        worker=to_checksum_address(address),
        hardware=mine.get("hardware", ""),
        backend=mine.get("backend", ""),
        device=mine.get("device", ""),
        registered=registered,
        live=last_seen is not None and registered and now - last_seen <= live_ttl_s,
        ejected=ejected and not registered,
        last_seen=last_seen,
        leases=_int(mine.get("leases")),
        submitted=_int(mine.get("submitted")),
        accepted=_int(theirs.get(ws.ACCEPTED)),
        rejected={
            k.removeprefix(ws.REJECTED_PREFIX): _int(v)
            for k, v in sorted(theirs.items())
            if k.startswith(ws.REJECTED_PREFIX)
        },
        why={
            k.removeprefix(ws.WHY_PREFIX): v
            for k, v in sorted(theirs.items())
            if k.startswith(ws.WHY_PREFIX)
        },
        ejection=ejection if ejected and not registered else "",
        units=_int(theirs.get(ws.UNITS)),
        submitted_per_min=round(ws.per_minute(map(_int, submits), now), 3),
        accepted_per_min=round(ws.per_minute(map(_int, accepts), now), 3),
    )


async def probe(client: httpx.AsyncClient, url: str, deadline_s: float) -> RelayHealth:
    """`GET {url}/healthz`: healthy when it answers 200 with status 'ok' within `deadline_s`
    in all (the client's timeout bounds each read; a relay dripping bytes meets this one)."""
    started = time.monotonic()
    try:
        async with (
            asyncio.timeout(deadline_s),
            client.stream("GET", url.rstrip("/") + "/healthz") as reply,
        ):
            body = b""
            async for chunk in reply.aiter_bytes():
                body += chunk
                if len(body) > HEALTH_BODY_LIMIT:
                    break
            status = reply.status_code
    except Exception as exc:  # any failure is the relay's verdict, never the status page's
        return RelayHealth(
            url=url,
            healthy=False,
            error=f"{type(exc).__name__}: {exc}"[:200],
            checked_at=time.time(),
        )
    latency = round((time.monotonic() - started) * 1000, 1)
    try:
        # untrusted_json: a relay's answer is hostile input (size and nesting bounded).
        doc = untrusted_json.loads(body, max_bytes=HEALTH_BODY_LIMIT)
    except untrusted_json.UntrustedJSONError:
        doc = None
    doc = doc if isinstance(doc, dict) else {}
    latest = doc.get("latest")
    healthy = status == 200 and doc.get("status") == "ok"
    return RelayHealth(
        url=url,
        healthy=healthy,
        status_code=status,
        latency_ms=latency,
        latest_version=latest if isinstance(latest, int) and not isinstance(latest, bool) else None,
        error="" if healthy else f"HTTP {status}, not a healthy /healthz answer",
        checked_at=time.time(),
    )


class RelayWatch:
    """The relays' health, checked at most once per `interval_s` however often it is asked: an
    answer older than that is served while a fresh check runs in the background (only the very
    first request waits), so page loads can never make the orchestrator hammer relays."""

    def __init__(self, relays: list[str], interval_s: float, timeout_s: float) -> None:
        self.relays, self.interval_s, self.timeout_s = list(relays), interval_s, timeout_s
        self._results: list[RelayHealth] | None = None
        self._at = 0.0
        self._task: asyncio.Task[None] | None = None

    async def health(self) -> list[RelayHealth]:
        if self._results is None or time.monotonic() - self._at >= self.interval_s:
            if self._task is None or self._task.done():
                self._task = asyncio.create_task(self._refresh())
            if self._results is None:
                await asyncio.shield(self._task)
        return list(self._results or [])

    async def _refresh(self) -> None:
        if not self.relays:
            self._results, self._at = [], time.monotonic()
            return
        async with httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=False) as client:
            checks = (probe(client, url, 2 * self.timeout_s) for url in self.relays)
            results = await asyncio.gather(*checks)
        self._results, self._at = list(results), time.monotonic()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


class StatusBoard:
    def __init__(
        self,
        redis: Redis,
        settings: OrchestratorSettings,
        policy: PolicyTracker,
        relays: RelayWatch,
    ) -> None:
        self.redis, self.settings, self.policy, self.relays = redis, settings, policy, relays
        self._cached: tuple[float, PoolStatus] | None = None
        self._lock = asyncio.Lock()

    async def pool_status(self, in_flight: Callable[[], Awaitable[int]]) -> PoolStatus:
        """The whole pool, at most `status_cache_s` old; concurrent misses build it once."""
        async with self._lock:
            hit = self._cached
            if hit is not None and time.monotonic() - hit[0] < self.settings.status_cache_s:
                return hit[1]
            status = await self._build(in_flight)
            self._cached = (time.monotonic(), status)
            return status

    async def _build(self, in_flight: Callable[[], Awaitable[int]]) -> PoolStatus:
        s = self.settings
        cap = s.status_max_workers
        since = time.time() - s.heartbeat_ttl_s
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrevrange(LIVE_WORKERS, 0, cap - 1, withscores=True)
            pipe.zcard(LIVE_WORKERS)
            pipe.zcount(LIVE_WORKERS, since, "+inf")
            pipe.hlen(WORKERS)
            pipe.xrevrange(streams.TRAINER_PROGRESS, count=s.status_rewards)
            seen, listed_total, live, registered, progress = await pipe.execute()
        entries: list[tuple[str, float | None]] = [(_text(w), float(t)) for w, t in seen]
        truncated = int(listed_total) > len(entries)
        # Workers ejected for silence left the roster; list them after it while there is room.
        room = cap - len(entries)
        if room > 0:
            ejected, complete = await self._ejected({w for w, _ in entries}, room + 1)
            truncated = truncated or not complete or len(ejected) > room
            entries += [(w, None) for w in ejected[:room]]
        else:
            truncated = truncated or bool(await self.redis.hlen(EJECTED))
        ann = await self.policy.latest()
        return PoolStatus(
            pool_id=s.pool_id,
            generated_at=time.time(),
            policy_version=ann.version if ann else None,
            trainer_step=ann.step if ann else None,
            min_version=oldest_admitted(ann.version, s.recipe.async_level) if ann else None,
            async_level=s.recipe.async_level,
            workers_registered=int(registered),
            workers_live=int(live),
            in_flight_groups=await in_flight(),
            throughput_window_s=ws.WINDOW_MINUTES * ws.BUCKET_S,
            relays=await self.relays.health(),
            rewards=rewards(progress),
            workers=await self.rows(entries),
            workers_truncated=truncated,
        )

    async def _ejected(self, listed: set[str], want: int) -> tuple[list[str], bool]:
        """Up to about `want` ejected workers not in `listed`, most recently ejected first, and
        whether that is all of them. HSCAN pages through the hash, a bounded number of times:
        a pool with a long history of ejections costs no more than that."""
        found: dict[str, float] = {}
        cursor = 0
        for _ in range(8):
            cursor, page = await self.redis.hscan(EJECTED, cursor, count=want)
            for raw, record in page.items():
                worker = _text(raw)
                if worker not in listed:
                    found[worker] = _ejected_at(record)
            cursor = int(cursor)
            if cursor == 0 or len(found) >= want:
                break
        ordered = sorted(found, key=lambda w: (-found[w], w))
        return ordered, cursor == 0

    async def worker(self, address: str) -> WorkerStatus | None:
        """One worker, or None when the pool has never heard of it."""
        worker = normal_address(address)
        score = await self.redis.zscore(LIVE_WORKERS, worker)
        (row,) = await self.rows([(worker, None if score is None else float(score))])
        # Registered once (its registration left backend and hardware), or counted by anyone.
        known = row.registered or row.ejected or row.backend or row.leases or row.submitted
        return row if known or row.accepted or row.rejected else None

    async def rows(self, entries: list[tuple[str, float | None]]) -> list[WorkerStatus]:
        """Rows of `(address, last seen)` in one pipeline: two hashes per worker and one field
        per throughput bucket, however long the pool has run."""
        if not entries:
            return []
        now = time.time()
        addresses = [w for w, _ in entries]
        minutes = ws.window(now)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hmget(WORKERS, addresses)
            pipe.hmget(EJECTED, addresses)
            for m in minutes:
                pipe.hmget(SUBMITS_PER_MINUTE.format(minute=m), addresses)
            for m in minutes:
                pipe.hmget(ws.VALIDATOR_ACCEPTED_PER_MINUTE.format(minute=m), addresses)
            for w in addresses:
                pipe.hgetall(WORKER_INFO.format(worker=w))
                pipe.hgetall(ws.VALIDATOR_WORKER.format(worker=w))
            replies = await pipe.execute()
        registered, ejected = replies[0], replies[1]
        n = len(minutes)
        submits, accepts = replies[2 : 2 + n], replies[2 + n : 2 + 2 * n]
        hashes = replies[2 + 2 * n :]
        return [
            worker_row(
                w,
                now=now,
                live_ttl_s=self.settings.heartbeat_ttl_s,
                last_seen=last_seen,
                registered=registered[i] is not None,
                ejected=ejected[i] is not None,
                ejection=_ejection_reason(ejected[i]),
                info=hashes[2 * i],
                verdicts=hashes[2 * i + 1],
                submits=[bucket[i] for bucket in submits],
                accepts=[bucket[i] for bucket in accepts],
            )
            for i, (w, last_seen) in enumerate(entries)
        ]


def _ejection_reason(record: bytes | str | None) -> str:
    """The reason in an ejection's record ("no heartbeat for 600 s"), or "" when unreadable."""
    if record is None:
        return ""
    try:
        reason = json.loads(record).get("reason", "")
    except (ValueError, AttributeError):
        return ""
    return reason[:128] if isinstance(reason, str) else ""


def _ejected_at(record: bytes | str) -> float:
    """When the ejector's record (services/orchestrator/ejector.py) says it ejected; 0 if unsure."""
    try:
        at = json.loads(record).get("at", 0)
    except (ValueError, AttributeError):
        return 0.0
    return float(at) if isinstance(at, int | float) else 0.0


def rewards(entries: list) -> list[RewardPoint]:
    """Reward points from XREVRANGE entries of the progress stream, oldest first; an entry that
    does not decode is skipped (the page shows the rest)."""
    points = []
    for entry_id, fields in reversed(entries):
        try:
            row = streams.decode(StepProgress, fields)
        except (ValidationError, ValueError):
            continue
        at = int(_text(entry_id).split("-", 1)[0]) / 1000  # the entry id is its time in ms
        points.append(
            RewardPoint(
                step=row.step,
                version=row.version,
                mean_reward=row.mean_reward,
                reward_task=row.reward_task,
                reward_length=row.reward_length,
                at=at,
            )
        )
    return points
