"""How every service connects to Redis: bounded timeouts, and a retry budget that rides out a
Redis restart (it refuses connections, then answers LOADING while it replays its AOF) instead
of ending the service with a traceback.

A retried write may land twice if the server applied it and the reply was lost. Everything
written to Redis is safe under that, as under the crash-and-restart it replaces: stream
readers skip ids already trained or decided, sets and acknowledgements are idempotent.
`make chaos` kills Redis during a run and counts every rollout afterwards.

A `redis+sentinel://` URL finds the primary through Redis Sentinel (docs/high-availability.md):
a connection refused, timed out or answered READONLY by a demoted primary asks the Sentinels
again, inside the same retry budget, so a failover looks to a service like a restart.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from redis.backoff import ExponentialBackoff
from redis.exceptions import AuthenticationError, BusyLoadingError, ConnectionError, TimeoutError

RETRY_ON = (ConnectionError, TimeoutError, BusyLoadingError)
# 0.1, 0.2, 0.4, 0.8 then 1 s apart: about 14 s in all, longer than a restart replaying an AOF
# of a few hundred MB.
RETRIES = 16


def _options(socket_timeout: float, retry: type) -> dict[str, object]:
    """The same bounds for the sync and asyncio clients (each has its own Retry class)."""
    return {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": min(socket_timeout, 5.0),
        "retry": retry(ExponentialBackoff(cap=1.0, base=0.1), RETRIES, RETRY_ON),
        "retry_on_error": list(RETRY_ON),
    }


SENTINEL_SCHEME = "redis+sentinel"


@dataclass(frozen=True)
class SentinelURL:
    """`redis+sentinel://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]`: the Sentinels
    to ask, the name they monitor the primary under, and the credentials of the data nodes (the
    role's ACL user; the Sentinels themselves are asked without them)."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None

    @classmethod
    def parse(cls, url: str) -> SentinelURL:
        parts = urlsplit(url)
        if parts.scheme != SENTINEL_SCHEME:
            raise ValueError(f"not a {SENTINEL_SCHEME}:// URL")
        credentials, _, hosts = parts.netloc.rpartition("@")
        user, _, password = credentials.partition(":")
        sentinels = []
        for host_port in hosts.split(","):
            host, _, port = host_port.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"sentinel address {host_port!r} is not HOST:PORT")
            sentinels.append((host, int(port)))
        service, _, db = parts.path.strip("/").partition("/")
        if not service:
            raise ValueError("the URL names no service (redis+sentinel://HOSTS/SERVICE/DB)")
        if db and not db.isdigit():
            raise ValueError(f"database {db!r} is not a number")
        return cls(
            tuple(sentinels),
            service,
            int(db or 0),
            unquote(user) or None,
            unquote(password) or None,
        )

    def connection_kwargs(self) -> dict[str, object]:
        return {"db": self.db, "username": self.username, "password": self.password}


class _PrimaryConnection(redis.sentinel.SentinelManagedConnection):
    """redis-py 8 reconnects a dropped connection inside `send_packed_command` straight to the
    address it had, not through `connect()`, which asks the Sentinels: a command retried after
    READONLY (its primary demoted) went back to the demoted node every time until the retry
    budget was spent. Seen in `prime-swarm chaos --redis-ha`: the trainer exited on a step's
    acknowledgement, the validator on its reads. Reconnecting here asks the Sentinels first."""

    def send_packed_command(self, command: object, check_health: bool = True) -> None:
        if not self._sock:
            self.connect()
        super().send_packed_command(command, check_health)


class _AsyncPrimaryConnection(redis.asyncio.sentinel.SentinelManagedConnection):
    """`_PrimaryConnection` for the asyncio client (the same reconnect, the same fix)."""

    async def send_packed_command(self, command: object, check_health: bool = True) -> None:
        if not self.is_connected:
            await self.connect()
        await super().send_packed_command(command, check_health)


def primary_run_id(r: redis.Redis) -> str | None:
    """The run id of the node the Sentinels call primary now (None: none agrees, or `r` is
    not a Sentinel client)."""
    manager = getattr(r.connection_pool, "sentinel_manager", None)
    if manager is None:
        return None
    for sentinel in manager.sentinels:
        try:
            state = sentinel.sentinel_masters().get(r.connection_pool.service_name)
        except (ConnectionError, TimeoutError):
            continue
        if state and manager.check_master_state(state, r.connection_pool.service_name):
            return str(state.get("runid") or "") or None
    return None


async def primary_run_id_async(r: redis.asyncio.Redis) -> str | None:
    manager = getattr(r.connection_pool, "sentinel_manager", None)
    if manager is None:
        return None
    for sentinel in manager.sentinels:
        try:
            state = (await sentinel.sentinel_masters()).get(r.connection_pool.service_name)
        except (ConnectionError, TimeoutError):
            continue
        if state and manager.check_master_state(state, r.connection_pool.service_name):
            return str(state.get("runid") or "") or None
    return None


def _sentinel_options(socket_timeout: float) -> dict[str, object]:
    # A Sentinel that is down or cut off must not hold the lookup: the next one is asked.
    return {"socket_timeout": min(socket_timeout, 2.0), "socket_connect_timeout": 1.0}


# With failover, a command sent to a primary that was then cut off waits its whole socket
# timeout before the client asks the Sentinels again: seen in `prime-swarm chaos --redis-ha`,
# a validator with 30 s stalled that long after each cut, though the replica was promoted in
# under 3 s. Every command here is short (the longest blocks 1 s: XREADGROUP), so 5 s is ample.
SENTINEL_SOCKET_TIMEOUT_S = 5.0


def connect(url: str, socket_timeout: float) -> redis.Redis:
    if url.startswith(SENTINEL_SCHEME + "://"):
        socket_timeout = min(socket_timeout, SENTINEL_SOCKET_TIMEOUT_S)
    options = _options(socket_timeout, redis.retry.Retry)
    if url.startswith(SENTINEL_SCHEME + "://"):
        where = SentinelURL.parse(url)
        sentinel = redis.sentinel.Sentinel(
            where.sentinels, sentinel_kwargs=_sentinel_options(socket_timeout)
        )
        return sentinel.master_for(
            where.service,
            connection_class=_PrimaryConnection,
            **options,
            **where.connection_kwargs(),
        )
    return redis.Redis.from_url(url, **options)


# An asyncio client opens a connection per concurrent command and, at redis-py's default cap of
# 100, fails the 101st at once ("Too many connections"): an orchestrator under a lease storm
# from a few hundred workers has that many requests in flight. Redis itself takes 10,000.
ASYNC_MAX_CONNECTIONS = 2000


def connect_async(url: str, socket_timeout: float) -> redis.asyncio.Redis:
    if url.startswith(SENTINEL_SCHEME + "://"):
        socket_timeout = min(socket_timeout, SENTINEL_SOCKET_TIMEOUT_S)
    options = {
        **_options(socket_timeout, redis.asyncio.retry.Retry),
        "max_connections": ASYNC_MAX_CONNECTIONS,
    }
    if url.startswith(SENTINEL_SCHEME + "://"):
        where = SentinelURL.parse(url)
        sentinel = redis.asyncio.sentinel.Sentinel(
            where.sentinels, sentinel_kwargs=_sentinel_options(socket_timeout)
        )
        return sentinel.master_for(
            where.service,
            connection_class=_AsyncPrimaryConnection,
            **options,
            **where.connection_kwargs(),
        )
    return redis.asyncio.Redis.from_url(url, **options)


@contextmanager
def exit_when_redis_is_gone(prog: str) -> Iterator[None]:
    """Redis still unreachable after the retry budget ends a service with one line on stderr
    and exit code 1, not a traceback: a supervisor restarts it, and it resumes from Redis. The
    message names host and port only (the URL may carry a password)."""
    try:
        yield
    except AuthenticationError as exc:
        # A subclass of ConnectionError: retried like an outage, but a restart cannot fix it.
        print(
            f"{prog}: Redis refused the user or password in the Redis URL ({exc}); check it "
            "against the ACL (`prime-swarm compose-secrets` wrote both)",
            file=sys.stderr,
        )
        sys.exit(2)
    except RETRY_ON as exc:
        print(
            f"{prog}: Redis did not come back within the retry budget ({exc}); exiting so "
            "that a supervisor restarts this service, which resumes from Redis",
            file=sys.stderr,
        )
        sys.exit(1)
