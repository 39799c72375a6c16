"""How every service connects to Redis: bounded timeouts, and a retry budget that rides out a
Redis restart (it refuses connections, then answers LOADING while it replays its AOF) instead
of ending the service with a traceback.

A retried write may land twice if the server applied it and the reply was lost. Everything
written to Redis is safe under that, as under the crash-and-restart it replaces: stream
readers skip ids already trained or decided, sets and acknowledgements are idempotent.
`make chaos` kills Redis during a run and counts every rollout afterwards.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import redis
import redis.asyncio
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


def connect(url: str, socket_timeout: float) -> redis.Redis:
    return redis.Redis.from_url(url, **_options(socket_timeout, redis.retry.Retry))


def connect_async(url: str, socket_timeout: float) -> redis.asyncio.Redis:
    return redis.asyncio.Redis.from_url(url, **_options(socket_timeout, redis.asyncio.retry.Retry))


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
